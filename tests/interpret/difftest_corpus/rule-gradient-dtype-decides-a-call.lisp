;; difftest seed=1104470 methods=forward(x);helper(x)
;; Found by the campaign on main (seed 1104470), minimized, then rewritten so that forward runs (the
;; minimized form's (matmul x w2) had a 0-d w2, which fails at run time in the module and the
;; interpreter alike, so the interpreter never saw the call) and x is read by an f32 op first (read by
;; the matmul itself, x's join of reads was bf16 too): a gradient passed to a helper. The module
;; gives the gradient of a bf16 matmul the dtype of its last backward node (bf16), so the program calls
;; helper only with bf16 and its public method casts f32 down at entry. The interpreter gave that
;; gradient X's dtype (f32), so it saw helper called with f32; its backward now follows the rules.
;; found: dtype cuda:helper: got torch.bfloat16 (2, 4), want torch.float32 (2, 4)
(defparam w2 (normal [4 4]) :trainable false) (defun helper (x &key (k 0.5)) (* k x)) (defun forward (x) (helper (gradient (sum (matmul (* x 0.5) w2)) x))) (defrun train :precision :bf16)
