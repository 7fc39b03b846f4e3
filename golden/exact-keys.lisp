;; A parameter's or sub-model's state_dict key is its source name, kept exactly: a
;; Python keyword is registered by name and read with getattr, one of nn.Module's own
;; attributes goes straight into its store; a plain name (self, input) is an attribute.
(defconst d 4)

(defmodel self (&key (d 4))
  (defparam input (normal [d d]))
  (defparam type (zeros [d]) :trainable false)
  (defun forward (x) (+ (matmul x input) type)))

(defparam class (normal [d d]))
(defparam lambda (self :d d))
(defparam type (stack 2 (self :d d)))
(defparam self (ones [d]))

(defun forward (x)
  (* self (chain type (lambda (matmul x class)))))
