;; difftest seed=1073346 methods=forward(x);helper(x)
;; Found by the campaign at b3f533d (seed 1073346), rewritten by hand from its minimized form: helper of a bf16 matmul: (+ x (zeros-like x)), called
;; only with bf16, so its public method casts f32 down at entry on every target (cuda's computed f32).
(defconst d 4)
(defparam w2 (normal [d])) (defun helper (x) (+ x (zeros-like x))) (defun forward (x) (helper (matmul x w2)))
(defrun train :precision :bf16)
