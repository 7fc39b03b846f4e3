;; difftest seed=1074474 methods=forward();helper(x)
;; Found by the campaign at b3f533d (seed 1074474), rewritten by hand from its minimized form: helper of a frozen parameter's element, called
;; only with bf16, so its public method casts f32 down at entry on every target (cuda's computed f32).
(defconst d 4)
(defparam w1 (normal [d]) :trainable false) (defun helper (x &key (k 0.5)) (+ x (zeros-like x))) (defun forward () (helper (at w1 2) :k 2.0))
(defrun train :precision :bf16)
