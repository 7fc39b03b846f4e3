;; difftest seed=1308338 methods=forward(x,ids)
;; Found by the campaign on main (seed 1308338, the program before minimizing to
;; found-backward-if-zeros), minimized again after that fix: x read twice by (* x x) in a bf16
;; region, in a branch of an `if`, under :f32. The backward `if` summed the two contributions in
;; x's own marks (f32), where a value read twice outside an `if` has them summed in the marks its
;; readers share (the region: bf16), as the interpreter does. They are now, in the branch too.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
(defconst d 4) (defmodel blk (&key (d 4) (idx 0)) (defun forward (x &key (k 1.0)) (if (= idx 1) 8 (* x x)))) (defparam sub (blk :d d)) (defun forward (x ids) (gradient (mean (with-numerics (:precision :bf16) (sub x :k 3.0))) x))
