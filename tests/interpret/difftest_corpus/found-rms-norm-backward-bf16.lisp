;; difftest seed=1007301 methods=forward(x,ids)
;; Found by the campaign (seed 1007301), minimized: under :bf16, the training gradient of
;; a gradient through fused-rms-norm. Its rule computes only rsqrt(mean(x^2)) in an island and
;; r*(u - n*mean(u*n)) in bf16, where the forward is one kernel, f32 inside, rounded once:
;; the cancelling difference in bf16 makes the backward's own derivative 0.09 from the f64
;; one in the second row, where the interpreter's (torch's f32-inside rms_norm) is 0.02 off.
;; Fixed: the rule is one kernel as the forward is (sx.rms_norm_backward), f32 inside and
;; rounded once to the dtype it computes in, as torch's bf16 rms_norm backward is.
;; found: backward cuda:forward: input: max |diff| 0.124
(defconst d 4) (defparam w1 (normal [d d]) :dtype :bf16) (defparam w2 (normal [d d])) (defparam v (normal [d])) (defparam table (normal [d])) (defun forward (x ids) (gradient (sum (fused-rms-norm (* x (mean x :axes [-1] :keepdims true)) v)) x)) (defrun train :precision :bf16)
