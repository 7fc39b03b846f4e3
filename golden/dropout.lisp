;; Dropout, active only in training mode, and random values shaped like a tensor (a VAE's
;; reparameterization), all drawn from torch's default generator: torch.manual_seed fixes them.
(defconst d 4)
(defconst p 0.1)
(defparam enc (normal [d (* 2 d)]))
(defun forward (x)
  (let ((h (dropout (matmul x enc) p))
        (mu (slice h :axis 1 :end d))
        (logvar (slice h :axis 1 :start d)))
    (+ mu (* (with-numerics (:sensitivity :high) (exp (* 0.5 logvar))) (randn-like mu)))))
(defun jitter (x)
  "Uniform noise in [0, 0.01) added to x."
  (+ x (* 0.01 (rand-like x))))
(defrun train :precision :bf16)
