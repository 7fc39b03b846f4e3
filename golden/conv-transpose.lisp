;; A UNet's upsampling step: a transposed convolution doubles the length (torch's weight
;; layout, the input channels first; :output-padding as torch's), one kernel as a
;; convolution is (bf16 in, f32 accumulation, one rounding under :bf16); its derivative
;; is the adjoint convolution.
(defparam up (normal [4 2 3]))
(defparam up-bias (zeros [2]))
(defparam up2 (normal [2 2 2 2]))
(defun forward (x img)
  [(conv-transpose1d x up up-bias :stride 2 :padding 1 :output-padding 1)
   (conv-transpose2d img up2 :stride 2)])
(defun up-gradient (x)
  (gradient (sum (square (conv-transpose1d x up up-bias :stride 2 :padding 1))) up))
(defrun train :precision :bf16)
