;; A name bound to another name keeps its source name (contract section 8): `saved-early`
;; names the first `x`, which `x` is then rebound around, and no temporary takes its place.
(defparam w (normal [4 4]))

(defun forward (x)
  (let ((x (matmul x w))
        (saved-early x)
        (x (tanh (matmul x w)))
        (x (+ x saved-early)))
    x))
