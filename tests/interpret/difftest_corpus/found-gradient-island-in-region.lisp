;; difftest seed=1380609 methods=forward(x,ids)
;; Found by the campaign on main (seed 1380609), rewritten small: under :f32, x read inside a bf16
;; region by the f32 island of a library op (log-softmax) and by a region op. The compiler sums
;; x's contributions in the frames its readers share, the region (bf16); the interpreter kept only
;; each node's innermost mode, island and region, which share none, and summed in f32. It now
;; keeps the modes of every form around a node and sums in the innermost they share.
;; found: dtype cuda:forward: got torch.bfloat16 (2, 4), want torch.float32 (2, 4)
(defun forward (x ids) (gradient (sum (with-numerics (:precision :bf16) (* (sum x) (log-softmax x)))) x))
