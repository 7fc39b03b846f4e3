;; difftest seed=1072996 methods=forward(x);helper(x)
;; Found by the campaign at b3f533d (seed 1072996), rewritten by hand from its minimized form: helper returning an if of a high parameter, called
;; only with bf16, so its public method casts f32 down at entry on every target (cuda's computed f32).
(defconst d 4)
(defparam w1 (normal []) :numerics :high) (defparam w2 (normal [d]) :dtype :bf16) (defun helper(x) (if (in d []) x w1)) (defun forward (x) (helper (linear x w2)))
(defrun train :precision :bf16)
