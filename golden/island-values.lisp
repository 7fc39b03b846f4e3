;; Several values out of an island: (with-numerics (:sensitivity :high) ... [A B]) gives
;; both, each in f32, bound as a call's are; a defun that ends in one returns both. Under
;; :bf16 the statistics of a layer norm are computed from the f32 activation once.
(defrun bf16 :precision :bf16)
(defconst d 8)
(defparam w (normal [d d] :std 0.1))

(defun moments (x)
  "The mean and variance over the last axis, in f32."
  (with-numerics (:sensitivity :high)
    (let ((mu (mean x :axes [-1] :keepdims true)))
      [mu (mean (* (- x mu) (- x mu)) :axes [-1] :keepdims true)])))

(defun forward (x)
  (let ((h (matmul x w))
        ([mu var] (moments h))
        ([scale shift] (with-numerics (:sensitivity :high) [(rsqrt (+ var 1e-5)) (- mu)])))
    (* (+ h shift) scale)))
