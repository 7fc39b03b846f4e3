;; difftest seed=1076570 methods=forward(x,ids);helper(x)
;; Found by the campaign of h-camp (seed 1076570), minimized: a gradient of a gradient through a
;; for. Its backward would go through the first gradient's adjoint loop, which no rule
;; differentiates (an internal error, a KeyError in the adjoint's copy): now a diagnostic.
;; found: compile cuda: KeyError: <input grad_x @13:60>
;; expect: no-internal-error
(defconst d 4)
(defmodel blk (&key (d 4) (idx 0))
(defun forward (x) x))
(defparam blocks (stack (i 2) (blk :d d :idx i)))
(defun helper (x) x)
(defun forward (x ids) (let ((a (gradient (mean (for (layer blocks) ((c x)) (* c x))) x))) (gradient (mean a) x)))
