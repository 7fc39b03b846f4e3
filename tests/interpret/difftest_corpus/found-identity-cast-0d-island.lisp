;; difftest seed=1 methods=forward(x)
;; A cast to a value's own dtype changes nothing: (cast (at v 3) :bf16) is still a 0-d
;; element, so beside the f32 input x it decides no dtype and the product is f32.
(defparam v (normal [4]))
(defun forward (x) (* (cast (at v 3) :bf16) (with-numerics (:sensitivity :high) x)))
(defrun train :precision :bf16)
