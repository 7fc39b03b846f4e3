;; gradient through regions: an `if` gives a backward `if` on the same condition; a `for`
;; (and `chain`) gives an adjoint loop over the layers in reverse, which computes each
;; layer's forward again from the carried values its forward loop recorded.
(defconst backout-layer 1)

(defmodel block (&key (d 4))
  (defparam w (normal [d d] :std 0.5))
  (defun forward (x &key (scale 1.0))
    (+ x (* scale (relu (matmul x w))))))

(defparam blocks (stack 3 (block :d 4)))
(defparam gate (normal [4]))

(defun energy (x0)
  (let (([x backout]
         (for (i layer blocks) ((x x0) (backout x0))
           (let ((y (layer x :scale (if (< i 2) 1.0 0.5)))
                 (y (if (= i 1) (* y gate) y)))
             [y (if (= i backout-layer) y backout)]))))
    (sum (* (- x backout) x))))

(defun forward (x0) (gradient (energy x0) x0))

(defun chained (x) (gradient (sum (chain blocks x)) x))

(defrun train :precision :bf16)
