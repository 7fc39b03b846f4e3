;; difftest seed=1 methods=forward(x)
;; The issue's case: a `for` whose carried value starts as x, which the body reads too;
;; d/dx sum(x * x * x) is 3x^2, the module gave x^2 (a contribution dropped).
(defmodel blk (&key (d 4)) (defparam w (normal [d d])) (defun forward (x) x))
(defparam blocks (stack 2 (blk :d 4)))
(defun forward (x) (gradient (sum (for (layer blocks) ((h x)) (* h x))) x))
