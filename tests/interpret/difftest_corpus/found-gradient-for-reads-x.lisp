;; difftest seed=82 methods=forward(x,ids)
;; Found by the campaign (seed 82 of tests/interpret/test_difftest.py), minimized: the loop carries c,
;; which starts as x, and its body gives x itself, so its value is x and d/dx sum is 1.
;; found: value cuda:forward (the module's gradient drops a contribution)
(defconst d 4)
(defmodel blk (&key (d 4)) (defun forward (x) x))
(defparam blocks (stack 2 (blk :d d)))
(defun forward (x ids) (gradient (sum (for (layer blocks) ((c x)) x)) x))
