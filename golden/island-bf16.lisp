;; 6.3: a sensitive island computes in f32, reads the master weight directly,
;; and its value stays f32 until it meets a bf16 value.
(defparam w (normal [8 8]))
(defparam scale (ones [8]))

(defun forward (x)
  (let ((h (matmul x w))
        (s (with-numerics (:sensitivity :high)
             (exp (* (- h (amax h :axes [-1] :keepdims true)) scale))))
        (t (sum s :axes [-1] :keepdims true)))
    (* h (/ s t))))

(defrun train :precision :bf16)
