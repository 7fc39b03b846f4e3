;; difftest seed=100321 methods=forward(x,ids);helper(x)
;; Found by the campaign (seed 100321), minimized: a gradient through a for loop whose
;; layer's forward is an if on the layer's const (as found-gradient-chain-if, through `for`).
;; found: compile cuda: KeyError: <softcap @1:...> (sx2torch/policy/rules.py, _op)
(defconst d 4)
(defmodel blk (&key (d 4) (idx 0))
  (defun forward (x) (if (= idx 1) x (softcap x 2.0))))
(defparam blocks (stack 2 (blk :d d)))
(defun helper (x) x)
(defun forward (x ids) (gradient (mean (for (layer blocks) ((c x)) (layer c))) x))
