;; Layers that differ: a stack whose layers know their index, (stack (i n) ...); a
;; parameter that only some layers have, :when; a per-layer input chosen by the layer
;; index from another stack, (nth STACK I X), or none where the layer has no use for it.
(defconst n-layer 4)

(defmodel embedding (&key (n 10) (d 8))
  (defparam weight (normal [n d]))
  (defun forward (ids) (take weight ids)))

(defmodel layer (&key (d 8) (index 0))
  (defparam w (normal [d d] :std 0.1))
  (defparam gate (ones [d]) :when (in index [0 3]))
  (defun forward (x extra)
    (let ((y (matmul x w)))
      (if (in index [0 3]) (+ y (* gate extra)) y))))

(defparam extras (stack 2 (embedding :n 10 :d 8)))
(defparam layers (stack (i n-layer) (layer :d 8 :index i)))

(defun forward (x ids)
  (for (i layer layers) ((h x))
    (layer h (if (= i 0) (nth extras 0 ids) (if (= i 3) (nth extras 1 ids) none)))))
