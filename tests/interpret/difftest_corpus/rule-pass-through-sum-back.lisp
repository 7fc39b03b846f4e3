;; difftest seed=1360806 methods=forward(x,ids)
;; Found by the campaign on main (seed 1360806), rewritten small: (- x v) of a :numerics :high v,
;; read by a bf16 matmul, under :bf16. The derivative by x is the gradient itself, no backward node
;; (rule-pass-through-backward); but x's rank is not known when the file compiles, so the compiler
;; cannot prove that nothing is summed back and writes a sum_to_size, which it made in the `-`
;; node's marks (f32, v being high), where the interpreter passed the bf16 gradient on. The sum
;; back of a passed-on gradient is made where the gradient was, in its dtype: bf16 on both sides.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
(defparam v (normal [4]) :numerics :high) (defparam w (normal [4 4])) (defun forward (x ids) (gradient (sum (matmul (- x v) w)) x)) (defrun train :precision :bf16)
