;; difftest seed=1310709 methods=forward(x,ids)
;; Found by the campaign on main (seed 1310709), minimized: the layer norm of a rank-1 product,
;; (matmul x (outer v v)), whose every row is a multiple of v. The layer norm does not depend on
;; that multiple, so the gradient with respect to x is zero but for eps, and both the module's
;; loss.backward() and torch.autograd on the interpreter return the rounding noise of a bf16
;; cancellation (up to 0.09 against 0.0, each as far from the f64 gradient as the other, in
;; different entries). No bound relative to the result covers an ill-conditioned gradient; the
;; forward values agree bit for bit. Not a miscompile: the case stays to be compiled and run.
;; found: backward cuda:forward: input: max |diff| 0.0898: got [0.0, 0.0791015625, 0.0, 0.0712890625, 0.60546875, 0.63671875], want [0.0, 0.0, 0.0, 0.0, 0.6875, 0.7265625]
;; expect: no-internal-error
(defconst d 4) (defparam v (normal [d])) (defun forward (x ids) (let ((b (matmul x (outer v v)))) (layer-norm b))) (defrun train :precision :bf16)
