;; difftest seed=1029740 methods=forward(x,ids)
;; Found by the campaign (seed 1029740), minimized: a parameter of shape [] is 0-d by rank,
;; as an element is. The interpreter made it decide a dtype beside a tensor with axes, and
;; did not read it with another 0-d value in the dtype they decide between themselves:
;; `(* v (at (at w2 1) 0))` multiplies two bf16 0-d values (the compiler's
;; `self.v * self.w2[1][0].to(torch.bfloat16)`), the interpreter multiplied in f32.
;; found: value cuda:forward: got [-0.4296875], want [-0.431640625] (the interpreter's)
(defparam w2 (normal [4 4]) :numerics :high)
(defparam v (normal []) :trainable false)
(defun forward (x ids) (+ (- x v) (* v (at (at w2 1) 0))))
(defrun train :precision :bf16)
