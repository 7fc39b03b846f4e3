;; Initializers: a matrix whose rows start from different draws (concat of 2-D parts),
;; a vector repeated, and ** in const arithmetic.
(defconst d 4)
(defconst bound (* (** 3 0.5) (** d -0.5)))

(defparam qkvo (concat [(uniform [(* 3 d) d] :low (- bound) :high bound) (zeros [d d])]))
(defparam pairs (repeat (* 2 d) (tensor [0.5 1.0])))

(defun forward (x) (* (matmul x (transpose qkvo [1 0])) pairs))
