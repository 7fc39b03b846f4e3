;; difftest seed=1000250 methods=forward(x,ids)
;; Found by the campaign (seed 1000250), minimized: under :f32, X read twice inside a bf16
;; region. Each contribution to X's gradient is computed in the region (bf16), as its forward
;; read is; the compiler sums them outside it (`grad_x = a.float() + b.float()`, an unmarked
;; f32 node), so the gradient is f32, where X read once gives a bf16 gradient. The
;; interpreter gives the join of the dtypes X is read in, bf16 either way. Not decided on this
;; branch: the sum of a value's contributions would carry the marks its reads share.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
;; known: the gradient of X read twice in a bf16 region is f32 (its contributions summed outside the region)
(defun forward (x ids) (gradient (sum (with-numerics (:precision :bf16) (concat [x x] :axis 1))) x))
