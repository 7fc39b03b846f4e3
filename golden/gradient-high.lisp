;; Each backward node carries the marks of the forward node it differentiates, and reading
;; a :numerics :high parameter is one: (matmul x w1) computes in f32 from w1's master, so
;; its backward, grad @ w1^T, reads the master in f32 too.
(defparam w1 (normal [4 4]) :numerics :high)
(defparam w2 (normal [4 4]))

(defun forward (x) (gradient (mean (matmul (matmul x w1) w2)) x))

(defrun train :precision :bf16)
