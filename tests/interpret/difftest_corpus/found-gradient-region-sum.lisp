;; difftest seed=1000250 methods=forward(x,ids)
;; Found by the campaign (seed 1000250), minimized: under :f32, X read twice inside a bf16
;; region. Each contribution to X's gradient is computed in the region (bf16), as its forward
;; read is; the compiler summed them outside it, with X's marks (an f32 node), so the gradient
;; was f32 where X read once gives bf16. The rule: the sum of a value's contributions carries
;; the marks its readers share, so here it is in the region and bf16 (the interpreter's join of
;; the dtypes X is read in).
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
(defun forward (x ids) (gradient (sum (with-numerics (:precision :bf16) (concat [x x] :axis 1))) x))
