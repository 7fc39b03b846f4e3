;; A decoder's attention as transformers' eager_attention_forward computes it: the
;; scores rounded by their matmul, scaled and masked in bf16, the softmax in f32, the
;; weights rounded back down for the matmul with V. DeepSeek's router takes its top k
;; unsorted and renormalises over them in the order torch's kernel leaves them.
(defconst heads 2)
(defconst head-dim 4)
(defparam wq (normal [8 8]))
(defparam wk (normal [8 8]))
(defparam wv (normal [8 8]))
(defun split-heads (h)
  (swap-axes (reshape h [0 0 heads head-dim]) 1 2))
(defun forward (x mask)
  (eager-attention (split-heads (matmul x wq)) (split-heads (matmul x wk))
                   (split-heads (matmul x wv)) mask :scale (** head-dim -0.5)))
(defun route (scores)
  (let (([weights chosen] (topk (sigmoid scores) 3 :sorted false)))
    (/ weights (sum weights :axes [-1] :keepdims true))))
(defrun train :precision :bf16)
