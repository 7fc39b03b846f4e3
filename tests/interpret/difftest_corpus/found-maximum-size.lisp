;; difftest seed=5313 methods=forward(x,ids)
;; Found by the campaign (seed 5313), minimized by hand: the maximum of a tensor and a size,
;; a Python integer when the module runs. torch.maximum takes two tensors, so the module
;; must write a clamp, as it does against a number written in the source.
;; found: run cuda:forward: TypeError: maximum(): argument 'other' (position 2) must be Tensor, not int
(defun forward (x ids) (+ (maximum x (size x :axis 0)) (minimum (size x :axis 1) x)))
(defrun train :precision :bf16)
