;; What is 0-d is decided by rank: an element of a vector, a full reduction and elementwise
;; ops on such are 0-d tensors, which decide no dtype beside a tensor with axes; the op
;; reads them in the dtype it computes in (a GPU's kernel converts them as it loads them,
;; the held targets round them). A row of a matrix has an axis, so contagion applies. A
;; cast to an element's own dtype changes nothing: it is still 0-d.
(defparam w (normal [4 4]))
(defparam v (normal [4]))

(defun forward (x)
  (let ((row (+ x (at w 0)))                   ; bf16: the row is a tensor
        (total (* x (sum (matmul x w))))       ; f32: the bf16 sum is 0-d
        (gated (* (sum x) (matmul x w)))       ; bf16: the f32 sum is read in bf16
        (scaled (* (cast (at v 3) :bf16) x)))  ; f32: the element is 0-d
    (+ row total gated scaled)))

(defrun train :precision :bf16)
