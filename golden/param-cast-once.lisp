;; 6.2: a parameter is cast down once per forward, however often it is read.
(defparam w (normal [4 4]))
(defparam b (zeros [4]))

(defun forward (x)
  (let ((h (+ (matmul x w) b)))
    (+ (matmul h w) b)))

(defrun train :precision :bf16)
