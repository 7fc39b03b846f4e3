;; The activation's dtype as a value: Gemma's embedding scale, sqrt(hidden) rounded to the
;; embedding's dtype (torch.tensor(hidden**0.5, dtype=x.dtype)), and a norm computed in f32
;; whose result is cast to the dtype the run computes in (.type_as(x)): bf16 here, the
;; identity under :f32.
(defconst vocab 10)
(defconst hidden 48)
(defparam wte (normal [vocab hidden]))
(defparam weight (zeros [hidden]))

(defun norm (x)
  (cast-run
   (with-numerics (:sensitivity :high)
     (* x (rsqrt (+ (mean (square x) :axes [-1] :keepdims true) 1e-6)) (+ 1.0 weight)))))

(defun forward (ids)
  (let ((h (take wte ids)))
    (norm (* h (scalar-like h (sqrt hidden))))))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
