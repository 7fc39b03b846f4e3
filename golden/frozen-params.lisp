;; 6.7: a frozen parameter is stored in the dtype its readers read: bf16 when
;; every reader is bf16 (half the memory), f32 when a sensitive node reads it.
(defparam embed (normal [8 8]) :trainable false)
(defparam bias (normal [8]) :trainable false)
(defparam w (normal [8 8]))

(defun forward (x)
  (let ((h (matmul (matmul x embed) w)))
    (with-numerics (:sensitivity :high) (+ h bias))))

(defrun train :precision :bf16)
