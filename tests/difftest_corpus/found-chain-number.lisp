;; difftest seed=1061 methods=forward(x)
;; expect: no-internal-error
;; Found while minimizing seed 1061: a chain whose layers return a number (their const).
;; The rules do not say what a carried value that turns from a tensor into a number is, so
;; a diagnostic is a fine answer; an internal error is not.
;; found: compile cuda: TypeError: '<' not supported between instances of 'DType' and 'NoneType' (sx2torch/policy/rules.py, _join)
;; known: internal compiler error joining a tensor and a number carried by a loop; not fixed on this branch
(defmodel blk (&key (idx 0)) (defun forward (x) idx))
(defparam blocks (stack (i 2) (blk :idx i)))
(defun forward (x) (chain blocks x))
