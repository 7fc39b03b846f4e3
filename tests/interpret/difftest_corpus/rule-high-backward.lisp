;; difftest seed=2 methods=forward(x)
;; Issue 26, known miscompile 5 (passes on this branch in this form): :numerics :high keeps every use of w in f32, the backward's too: d/dx of sum(x w) reads
;; w from the master, not rounded to bf16.
(defparam w (normal [4 4]) :numerics :high)
(defun forward (x) (gradient (sum (matmul x w)) x))
(defrun train :precision :bf16)
