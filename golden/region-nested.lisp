;; 6.5: the innermost form wins: an island inside a region is f32, and a region
;; inside an island is bf16.
(defparam w (normal [8 8]))

(defun forward (x)
  (with-numerics (:precision :bf16)
    (let ((h (matmul x w))
          (p (with-numerics (:sensitivity :high)
               (let ((e (exp h)))
                 (* e (with-numerics (:precision :bf16) (matmul e w)))))))
      (+ h p))))

(defrun train :precision :f32)
