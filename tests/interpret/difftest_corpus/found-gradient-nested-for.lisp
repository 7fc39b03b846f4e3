;; difftest seed=1072468 methods=forward(x,ids);helper(x)
;; Found by the campaign of h-camp (seed 1072468), minimized: a gradient through a for inside a
;; for. The outer adjoint loop computes its layer again, the inner loop among it, whose value
;; nothing reads: prune dropped that copy, which records what the inner adjoint loop reads
;; (an internal error in the policy).
;; found: compile cuda: KeyError: <for  @13:111>
(defconst d 4)
(defmodel blk (&key (d 4))
(defun forward (x) x))
(defparam blocks (stack 2 (blk :d d)))
(defun helper (x) x)
(defun forward (x ids) (gradient (mean (for (layer blocks) ((c x)) (for (layer blocks) ((neg x)) c))) x))
