;; Integer and boolean sums are int64, as torch's: a count of the kept positions, the
;; running count of a mask (positions from an attention mask, transformers' cumsum - 1),
;; expanded back over the row as integers; none is rounded under :bf16 (a cast makes
;; one a bf16 scale).
(defparam w (normal [8 8]))
(defun forward (x)
  (let ((keep (> x 0))
        (positions (- (cumsum (cast keep :i64) :axis 1) 1))
        (counts (expand-as (sum keep :axes [1] :keepdims true) positions)))
    [(* (matmul x w) (cast (- counts positions) :bf16)) (sum positions :axes [1])]))
(defrun train :precision :bf16)
