;; difftest seed=1100606 methods=forward(x,ids)
;; Found by the campaign on main (seed 1100606), minimized: the gradient through a cast-run in a bf16
;; region under :f32. A conversion's gradient is the identity (LANGUAGE.md, gradient), so the module's
;; gradient is the f32 seed itself, the dtype of its last backward node; the interpreter gives a
;; gradient the dtype of the ops that read X (the region's bf16), as in known-8 and known-9.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
;; known: the interpreter's gradient dtype is the join of X's reads, not its backward's dtype
(defun forward (x ids) (gradient (sum (with-numerics (:precision :bf16) (cast-run x))) x))
