;; difftest seed=1308338 methods=forward(x,ids)
;; Found by the campaign on main (seed 1308338), minimized: a gradient through an `if` one of whose
;; branches reads x not (a number), in a bf16 region under :f32. The backward `if` gave that branch
;; f32 zeros, which took part in its join, so the gradient was f32 where the branch taken gives bf16.
;; The zeros decide no dtype now: they are made in the join's dtype (bf16), as the interpreter has.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
(defconst d 4) (defmodel blk (&key (d 4) (idx 0)) (defun forward (x &key (k 1.0)) (if (= idx 1) 8 (reshape x [8])))) (defparam sub (blk :d d)) (defun forward (x ids) (gradient (mean (with-numerics (:precision :bf16) (sub x :k 3.0))) x))
