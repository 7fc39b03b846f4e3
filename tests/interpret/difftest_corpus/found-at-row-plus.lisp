;; difftest seed=100103 methods=forward(x,ids)
;; Found by the campaign (seed 100103, (at (causal-mask (* w1 v)) 2) + x), minimized: the row
;; (at w1 2) of a trained matrix is read in bf16 under :bf16, so the sum with x is bf16.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
(defconst d 4)
(defparam w1 (normal [d d]))
(defun forward (x ids) (+ (at w1 2) x))
(defrun train :precision :bf16)
