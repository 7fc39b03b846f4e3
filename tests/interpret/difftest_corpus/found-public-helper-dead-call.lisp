;; difftest seed=1090649 methods=forward(x,ids);helper(x)
;; found: dtype metal:helper: a bf16 value held in f32 that is not rounded to bf16
;; found: dtype cpu:helper: a bf16 value held in f32 that is not rounded to bf16
;; The helper's only call is dead (its value `a` is never read), so the compiler drops it and
;; the helper keeps its f32 method; the tester took the interpreter's entry-cast reading for it on the held targets.
(defconst d 4) (defparam w2 (normal [d]) :trainable false) (defun helper (x &key (k 0.5)) (sigmoid x)) (defun forward (x ids) (let ((a (helper (matmul x w2) :k 2.0))) x)) (defrun train :precision :bf16)
