;; Regions: a loop over a stack that knows the layer index and carries two values
;; (a U-net style backout), and conditions on the index and on consts. The
;; conditions are decided when the module runs: both branches are compiled.
(defconst n-layer 4)
(defconst backout-layer 2)
(defconst gated true)

(defmodel block (&key (d 8))
  (defparam w (normal [d d] :std 0.1))
  (defun forward (x &key (scale 1.0))
    (+ x (* scale (relu (matmul x w))))))

(defparam blocks (stack n-layer (block :d 8)))
(defparam gate (ones [8]))

(defun forward (x0)
  (let (([x backout]
         (for (i layer blocks) ((x x0) (backout x0))
           (let ((y (layer x :scale (if (< i 2) 1.0 0.5)))
                 (y (if (and gated (= i 1)) (* y gate) y)))
             [y (if (= i backout-layer) y backout)]))))
    (- x backout)))

(defrun train :precision :bf16)
