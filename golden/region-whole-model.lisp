;; 6.5: a region around a whole model computes in bf16 even where every value
;; it reads is f32, unlike the :bf16 policy, which waits for a parameter.
(defparam w (normal [8 8]))

(defun forward (x)
  (with-numerics (:precision :bf16)
    (matmul (tanh x) w)))

(defrun train :precision :f32)
