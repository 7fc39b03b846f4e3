;; difftest seed=3 methods=forward(x)
;; Cause E of issue 26: a 0-d f32 operand of a bf16 op is read in bf16 on either side, as a
;; GPU's kernel converts it as it loads it. The interpreter left it to torch's CPU kernel,
;; which rounds a first 0-d operand and reads a later one as a scalar in f32, and so did
;; the cuda module run on a CPU; the held targets rounded both.
(defparam v (normal [4]) :numerics :high)
(defparam w (normal [4 4]))
(defun forward (x) (* (linear x w) (at v 1)))
(defrun train :precision :bf16)
