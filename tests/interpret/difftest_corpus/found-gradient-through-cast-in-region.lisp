;; difftest seed=1100606 methods=forward(x,ids)
;; Found by the campaign on main (seed 1100606), minimized: the gradient through a cast-run in a bf16
;; region under :f32. A conversion's gradient is the identity, so the gradient is its seed, which was
;; made f32 outside the region; the seed of ones is now made where the sum's input is computed, in the
;; region, so the gradient is bf16 as the interpreter gives it.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
(defun forward (x ids) (gradient (sum (with-numerics (:precision :bf16) (cast-run x))) x))
