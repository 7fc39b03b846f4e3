;; 6.4: a matmul inside an island casts its operands up and runs an f32 GEMM.
(defparam w (normal [8 8]))

(defun forward (x)
  (let ((h (relu (matmul x w))))
    (with-numerics (:sensitivity :high) (matmul h w))))

(defrun train :precision :bf16)
