;; difftest seed=302909 methods=forward(x,ids)
;; Found by the campaign (seed 302909), minimized: a row of the (zero) gradient to a
;; bf16-stored parameter, times that parameter. The row decides the matmul's dtype; the
;; module reads it as a 0-d element and casts nothing, so torch refuses an f32 @ bf16.
;; found: run cuda:forward: RuntimeError: expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16
(defconst d 4)
(defparam w1 (normal [d d]) :dtype :bf16)
(defun forward (x ids) (matmul (at (gradient (mean x) w1) 2) w1))
(defrun train :precision :bf16)
