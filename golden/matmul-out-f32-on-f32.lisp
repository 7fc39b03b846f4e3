;; 6.4: on f32 operands :out :f32 changes no value: both matmuls are plain
;; f32 GEMMs.
(defparam w1 (normal [8 8]))
(defparam w2 (normal [8 8]))

(defun forward (x)
  (let ((rounded (matmul x w1))
        (exact (matmul rounded w2 :out :f32)))
    (with-numerics (:sensitivity :high) (exp exact))))

(defrun train :precision :f32)
