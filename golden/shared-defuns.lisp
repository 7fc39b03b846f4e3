;; A top-level defun is seen by every model: a sub-model that calls one (or one it calls)
;; gets it as its own. It sees only its arguments and let locals, so it is written once, as
;; a module-level function every class calls.
(defun gelu-new (x)
  (* 0.5 x (+ 1.0 (tanh (* 0.7978845608 (+ x (* 0.044715 x x x)))))))

(defun twice (x) (gelu-new (gelu-new x)))

(defmodel block (&key (d 4))
  (defparam w (normal [d d]))
  (defun forward (x) (twice (matmul x w))))

(defparam blocks (stack 2 (block :d 4)))

(defun forward (x) (gelu-new (chain blocks x)))
