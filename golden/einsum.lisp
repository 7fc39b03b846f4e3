;; einsum as model files write it: attention scores over heads ("bhqd,bhkd->bhqk"), a
;; per-head projection with the batch axes left to "...", computed in the policy's dtype
;; as matmul is (bf16 operands under :bf16, one rounding); its derivative is an einsum of
;; the gradient and the other operands.
(defparam proj (normal [2 4 4]))
(defun forward (q)
  (let ((scores (einsum "bhqd,bhkd->bhqk" (einsum "...hd,hde->...he" q proj) q)))
    (softmax scores)))
(defun proj-gradient (q) (gradient (sum (* (forward q) (forward q))) proj))
(defrun train :precision :bf16)
