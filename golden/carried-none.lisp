;; A value computed once, by the first layer, and read by every later one: a loop's carried
;; value may start as none (Python's None) where the first layer reads it not, as T5's
;; stack starts its position bias, which block 0 computes from its own table.
(defconst n-layer 3)

(defmodel layer (&key (d 4) (first false))
  (defparam w (normal [d d] :std 0.5))
  (defparam table (normal [d]) :when first)
  (defun forward (x shared)
    (let ((shared (if first (* table 2.0) shared)))
      [(+ x (* (matmul x w) shared)) shared])))

(defparam layers (stack (i n-layer) (layer :d 4 :first (= i 0))))

(defun forward (x)
  (let (([h _] (for (layer layers) ((h x) (shared none))
                 (let (([h shared] (layer h shared))) [h shared]))))
    h))

(defrun train :precision :bf16)
