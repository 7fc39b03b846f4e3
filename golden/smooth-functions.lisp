;; Mamba's time step and its discretization: softplus (linear past its threshold, so a
;; large pre-activation gives itself, not the inf of log(1 + exp x)), log1p and expm1,
;; each one torch call computing in f32 and rounding once under :bf16, as exp does.
(defconst d 4)
(defparam dt-proj (normal [d d]))
(defparam dt-bias (zeros [d]))
(defparam a-log (zeros [d]))
(defun forward (x)
  (let ((dt (softplus (+ (matmul x dt-proj) dt-bias)))
        (decay (expm1 (* dt (neg (exp a-log))))))
    (+ (log1p (square decay)) (softplus x :beta 2.0 :threshold 10))))
(defun step-gradient (x)
  (gradient (sum (softplus (matmul x dt-proj))) dt-proj))
(defrun train :precision :bf16)
