;; 6.2: under :bf16 a value stays f32 until it meets a parameter; scalars never decide.
(defconst d 8)
(defparam w (normal [d d]))

(defun forward (x)
  (let ((y (* (exp x) 2.0))
        (z (matmul y w)))
    (+ z y)))

(defrun train :precision :bf16)
