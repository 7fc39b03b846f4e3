;; Lisp names that Python reserves, or that the module itself uses, are renamed
;; predictably and capture nothing.
(defconst class 4)
(defparam self (normal [class class]))
(defparam torch (ones [class]))

(defun lambda (sx nn)
  "Docstrings stay inert: \"\"\" and \\ and 'quotes'."
  (let ((super (+ sx nn))
        (is-ok? (* super torch))
        (is_ok? (- super torch)))
    (+ (matmul is-ok? self) is_ok?)))

(defun forward (x) (lambda x x))
