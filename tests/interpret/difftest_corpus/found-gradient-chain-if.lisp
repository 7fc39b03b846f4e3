;; difftest seed=6 methods=forward(x,ids);helper(x)
;; Found by the campaign (seed 6 of tests/interpret/test_difftest.py, and seed 1061), minimized: a
;; gradient through a chain whose layer's forward is an if on the layer's const; the
;; interpreter gives d/dx of the mean of x -> x*x*x (layer 0) -> itself (layer 1).
;; found: compile cuda: KeyError: <- @1:...> (sx2torch/policy/rules.py, _op: a node of the adjoint loop has no dtype)
(defconst d 4)
(defmodel blk (&key (d 4) (idx 0))
  (defun forward (x &key (k 1.0)) (if (= idx 1) x (* x k x))))
(defparam blocks (stack 2 (blk :d d)))
(defun helper (x) x)
(defun forward (x ids) (gradient (mean (chain blocks x)) x))
