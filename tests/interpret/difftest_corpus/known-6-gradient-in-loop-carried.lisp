;; difftest seed=1001227 methods=forward(x)
;; Found by the campaign (seed 1001227), minimized by hand: a `gradient` with respect to X
;; inside a loop whose carried value starts as X. The carried value depends on X (it is X in
;; the first iteration), but the compiler differentiates the body with the carried value held
;; fixed, so the path through it is lost: d(sum (* c x))/dx is c, where the interpreter
;; (autograd through the carried tensor) gives c + x in the first iteration. Not decided yet:
;; either the gradient goes back through the iterations before it, or a gradient inside a loop
;; with respect to a value the carried values depend on is a diagnostic.
;; found: value cuda:forward
;; known: a gradient inside a loop loses the path through the carried value that starts as X
(defmodel blk (&key (d 4)) (defparam w (normal [d d])) (defun forward (x) x))
(defparam blocks (stack 2 (blk :d 4)))
(defun forward (x) (for (layer blocks) ((c x)) (layer (* c (gradient (sum (* c x)) x)))))
