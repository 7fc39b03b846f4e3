;; difftest seed=1003806 methods=forward(x);helper(x)
;; Found by the campaign (seed 1003806), minimized: a helper the program calls only with
;; bf16, called alone with f32. cuda's one method squared the f32 argument in f32 (what
;; the source gives for f32, as the interpreter computes); the held targets' one method
;; rounded it to bf16 at entry and squared in bf16. The public method computes the f32
;; specialization on every target now; the held targets' bf16 callers call helper_bf16.
;; found: value metal:helper: max |diff| 0.00391 (and cpu:helper, targets metal:helper)
(defconst d 4)
(defparam w2 (normal [d]))
(defun helper (x) (square x))
(defun forward (x) (helper (matmul x w2)))
(defrun train :precision :bf16)
