;; difftest seed=1061 methods=forward(x)
;; expect: no-internal-error
;; Found while minimizing seed 1061: a chain whose layers return a number (their const).
;; A carried value must be a tensor (docs/LANGUAGE.md, `for`): the layers' number is a
;; located diagnostic, no longer an internal error in the policy's join.
;; found: compile cuda: TypeError: '<' not supported between instances of 'DType' and 'NoneType' (sx2torch/policy/rules.py, _join)
(defmodel blk (&key (idx 0)) (defun forward (x) idx))
(defparam blocks (stack (i 2) (blk :idx i)))
(defun forward (x) (chain blocks x))
