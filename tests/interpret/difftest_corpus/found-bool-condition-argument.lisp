;; difftest seed=3000006 methods=forward(x,keep);helper(x)
;; found: diagnostic cuda: 'where' needs a boolean condition, such as (> x 0)
;; A boolean argument as its caller passes it (issue 38): `keep`, where's condition, is
;; taken as booleans (the public method refused it, typing it f32).
(defconst d 4)
(defparam w1 (normal [d d]))
(defun helper (x) (* x 2.0))
(defun forward (x keep) (where keep (matmul x w1) (neg x)))
(defrun train :precision :bf16)
