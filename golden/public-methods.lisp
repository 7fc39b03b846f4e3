;; A public method computes the same on every target. The norm is called only inside the
;; bf16 residual stream: its one method casts x down at entry, so alone with f32 it
;; computes what its callers compute after that cast (its f32 island reads x through
;; `.float()`, which on cuda rounds the gradient only where x is bf16). `gate` is called
;; with f32 and with bf16: its bf16 body is a function of its own on every target (the
;; value stays f32 with f32 input and bf16 with bf16 input).
(defmodel norm (&key (d 8))
  (defparam g (ones [d]))
  (defun forward (x)
    "The rows scaled to unit root mean square in f32, then by the gain."
    [x (* g (with-numerics (:sensitivity :high)
              (* x (rsqrt (+ (mean (* x x) :axes [-1] :keepdims true) 1e-6)))))]))

(defmodel block (&key (d 8))
  (defparam w (normal [d d] :std 0.1))
  (defparam ln (norm :d d))
  (defun forward (x)
    "The residual stream plus a gated layer of its norm."
    (let (([_ n] (ln x)))
      (+ x (gate (matmul n w))))))

(defun gate (x) (* x (sigmoid x)))

(defparam w-in (normal [8 8] :std 0.1))
(defparam blocks (stack 2 (block :d 8)))

(defun forward (x)
  (+ (gate x) (gate (chain blocks (matmul x w-in)))))

(defrun train :precision :bf16)
