;; 6.3: under :f32 the sensitivity mark changes nothing: every node is f32 already,
;; so the island holds no casts.
(defparam w (normal [8 8]))
(defparam scale (ones [8]))

(defun forward (x)
  (let ((h (matmul x w))
        (s (with-numerics (:sensitivity :high)
             (exp (* (- h (amax h :axes [-1] :keepdims true)) scale))))
        (t (sum s :axes [-1] :keepdims true)))
    (* h (/ s t))))

(defrun train :precision :f32)
