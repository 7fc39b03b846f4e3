;; difftest seed=4 methods=forward(x)
;; Forms the generator does not draw: a :when parameter made on some layers only, read under
;; an if on the same condition, and a none argument for the layers that read no extra input
;; (as golden/layer-params).
(defmodel blk (&key (d 4) (idx 0))
  (defparam w (normal [d d]))
  (defparam gate (normal [d]) :when (in idx [0 2]))
  (defun forward (x ve)
    (let ((h (matmul x w)))
      (if (in idx [0 2]) (+ (* h gate) ve) h))))
(defparam blocks (stack (i 3) (blk :d 4 :idx i)))
(defun forward (x)
  (for (i layer blocks) ((h x)) (layer h (if (in i [0 2]) x none))))
(defrun train :precision :bf16)
