;; difftest seed=1032606 methods=forward(x,ids)
;; Found by the campaign (seeds 1032606, 1027305, 1010968), minimized: the interpreter
;; returned a 0-d branch of an `if` (`(amax v)`, an element) as it was, without the join of
;; the branches' dtypes, and kept it 0-d beside a branch with an axis; the rules: the value
;; has the join (bf16 here, the compiler's `.to(torch.bfloat16)`), and it is 0-d by rank
;; only where both branches are (a `cross-entropy` is, as a full reduction is).
;; found: value cuda:forward: got [0.93359375, ...], want [0.9326171875, ...] (the interpreter's)
(defconst flag true)
(defparam v (normal [4]) :numerics :high)
(defun forward (x ids) (if flag (amax v) (cast v :bf16)))
(defrun train :precision :bf16)
