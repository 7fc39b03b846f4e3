;; 6.4: a bf16 matmul rounds its product on store; :out :f32 keeps the f32
;; accumulator of the bf16 GEMM, an island like (cast x :f32).
(defparam w1 (normal [8 8]))
(defparam w2 (normal [8 8]))

(defun forward (x)
  (let ((rounded (matmul x w1))
        (exact (matmul rounded w2 :out :f32)))
    (with-numerics (:sensitivity :high) (exp exact))))

(defrun train :precision :bf16)
