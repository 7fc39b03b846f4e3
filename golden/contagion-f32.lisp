;; 6.2: under :f32 every node computes in f32.
(defconst d 8)
(defparam w (normal [d d]))

(defun forward (x)
  (let ((y (* (exp x) 2.0))
        (z (matmul y w)))
    (+ z y)))

(defrun train :precision :f32)
