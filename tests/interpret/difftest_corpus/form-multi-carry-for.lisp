;; difftest seed=3 methods=forward(x)
;; Forms the generator does not draw: a for that carries two values, bound with [A B], its
;; body choosing by the layer index, under :bf16 (the carried values' dtypes join).
(defmodel blk (&key (d 4)) (defparam w (normal [d d])) (defun forward (x) (matmul x w)))
(defparam blocks (stack 3 (blk :d 4)))
(defun forward (x)
  (let (([h acc] (for (i layer blocks) ((h x) (acc (* x 0.5)))
                   (let ((y (layer h))) [y (if (< i 2) (+ acc y) acc)]))))
    (- h acc)))
(defrun train :precision :bf16)
