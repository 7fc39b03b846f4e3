;; A defun called with different input dtypes gets one method per signature where
;; their code differs; one called inside a with-numerics form computes with its mark.
(defparam w (normal [8 8]))

(defun gate (x) (* x (sigmoid x)))

(defun forward (x)
  (let ((a (gate x))
        (b (gate (matmul x w)))
        (c (with-numerics (:sensitivity :high) (gate b))))
    (+ a b c)))

(defrun train :precision :bf16)
