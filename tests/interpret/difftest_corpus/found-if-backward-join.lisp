;; difftest seed=1240367 methods=forward(x,ids)
;; Found by the lead's campaign on main (seeds 1240367 and 1241968), minimized: a gradient through
;; an `if` whose branches have different dtypes under :bf16 (x is f32, (matmul x w2) is bf16). The
;; backward `if` is an `if` of the two branches' backwards, joined as the forward `if` is
;; (docs/LANGUAGE.md: "joined as an op reading both would compute"), so the x branch's gradient
;; is cast to bf16: a bf16 gradient, as the compiler writes it. The interpreter differentiated
;; only the branch taken, whose backward passes the seed on (f32); it now walks the branch not
;; taken too, for its contributions' dtypes, and joins them.
;; found: dtype cuda:forward: got torch.bfloat16 (2, 4), want torch.float32 (2, 4)
(defconst d 4) (defparam w2 (normal [d])) (defun forward (x ids) (gradient (sum (if (= d 4) x (matmul x w2))) x)) (defrun train :precision :bf16)
