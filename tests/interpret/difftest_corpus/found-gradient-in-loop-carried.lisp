;; difftest seed=1001227 methods=forward(x)
;; Found by the campaign (seed 1001227), minimized by hand: a `gradient` with respect to X
;; inside a loop whose carried value starts as X. The carried value depends on X (it is X in
;; the first iteration, and X's gradient after it), so d(sum (* c x))/dx is c + x there; the
;; compiler differentiated the body with the carried value held fixed and gave c. Going back
;; through the iterations before would nest this gradient's backward once per layer, so it
;; is a diagnostic at the gradient form (tests/gradient/test_loop_gradient.py).
;; expect: no-internal-error
(defmodel blk (&key (d 4)) (defparam w (normal [d d])) (defun forward (x) x))
(defparam blocks (stack 2 (blk :d 4)))
(defun forward (x) (for (layer blocks) ((c x)) (layer (* c (gradient (sum (* c x)) x)))))
