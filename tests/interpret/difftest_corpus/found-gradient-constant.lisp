;; difftest seed=1219766 methods=forward(x)
;; Found by h-interp's gradient campaign (seed 1219766), cut down by hand: the gradient of a Y linear in x
;; is a constant. The interpreter's value then has no autograd graph while the module's result does,
;; and the backward oracle's torch.autograd.grad raised (a checker error); a constant's gradients are 0.
(defmodel blk (&key (d 4)) (defparam w (normal [d d])) (defun forward (x) (neg (with-numerics (:precision :bf16) x))))
(defparam blocks (stack 2 (blk :d 4)))
(defparam w2 (normal [4 4]) :numerics :high)
(defun forward (x) (gradient (mean (swap-axes (reshape (for (layer blocks) ((c (matmul x w2))) (layer x)) [4 2]) 0 1)) x))
(defrun train :precision :bf16)
