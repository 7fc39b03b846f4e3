;; difftest seed=1065577 methods=forward(x,ids)
;; Found by the campaign at b3f533d (seed 1065577), minimized: x is read by f32 ops only, behind a
;; bf16 matmul with w1; the module's backward meets w1 and computes the rest in bf16, as the
;; rules lower a backward; the interpreter computes the gradient in f32 (the join of x's reads).
;; found: value cuda:forward: max |diff| 0.0634: got [-0.9784497618675232, -0.8293595910072327, 0.311612993478775, -0.060098085552453995, 0.9615378379821777, -0.24233891069889069], want [-0.
;; Passes since the interpreter's backward is symbolic (sx2torch/interpret/backward.py): each backward
;; node typed by the rules, in its forward node's marks.
(defconst d 4)
(defparam w1 (normal [d d]))
(defparam w2 (normal [d d]))
(defun helper (x &key (k 0.5)) (- w2 (sum x)))
(defun forward (x ids) (cos (gradient (sum (helper (matmul (/ x (+ x 1.0)) w1) :k -1.0)) x)))
(defrun train :precision :bf16)
