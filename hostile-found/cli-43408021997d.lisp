;; Sub-models: consts as keyword arguments, a stack applied with chain, a
;; single instance called by name, and arithmetic on consts.
(defconst d 16)
(defconst n-layer 3) (defconst hidden (* 4 d))

(defmodel mlp (&key (d 16) (hidden 64))
  "A residual two-layer perceptron."
  (defparam w-in (normal [d hidden] :std 0.02))
  (defparam w-out (zeros [hidden d]))
  (defun forward (x)
    (+ x (matmul (gelu (matmul x w-in)) w-out))))

(defmodel head
(&key (d 16))
  (defparam w (normal [d 1]))
  (defun forward (x) (matmul x w)))

(defparam layers (stack n-layer (mlp :d d :hidden hidden)))
(defparam out (head :d d))

(defun forward (x)
  (out (chain layers x)))

(defrun train :precision :f32)
