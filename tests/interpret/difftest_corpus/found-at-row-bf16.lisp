;; difftest seed=1 methods=forward(x)
;; (at w 0) of a matrix is a row (rank 1), not a 0-d element: it decides the dtype, so under
;; :bf16 the product reads w in bf16 and is bf16.
(defparam w (normal [4 4]))
(defun forward (x) (* x (at w 0)))
(defrun train :precision :bf16)
