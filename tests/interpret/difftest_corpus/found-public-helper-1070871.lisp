;; difftest seed=1070871 methods=forward();helper(x)
;; Found by the campaign at b3f533d (seed 1070871), rewritten by hand from its minimized form: helper of a bf16-stored parameter's gelu, with logsumexp, called
;; only with bf16, so its public method casts f32 down at entry on every target (cuda's computed f32).
(defconst d 4)
(defparam w1 (normal []) :dtype :bf16) (defun helper (x &key (k 0.5)) (+ x (logsumexp x :axes [] :keepdims true))) (defun forward () (helper (gelu w1) :k -1.0))
(defrun train :precision :bf16)
