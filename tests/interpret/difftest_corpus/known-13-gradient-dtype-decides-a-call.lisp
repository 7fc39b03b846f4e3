;; difftest seed=1104470 methods=forward(x);helper(x)
;; Found by the campaign on main (seed 1104470), minimized: a gradient passed to a helper. The module
;; gives the gradient of a bf16 matmul the dtype of its last backward node (bf16), so the program calls
;; helper only with bf16 and its public method casts f32 down at entry; the interpreter gives that
;; gradient X's dtype (f32), so it sees helper called with f32, as in known-8, known-9 and known-12.
;; found: dtype cuda:helper: got torch.bfloat16 (2, 4), want torch.float32 (2, 4)
;; known: the interpreter's gradient dtype is the join of X's reads, not its backward's dtype
(defparam w2 (normal []) :trainable false) (defun helper (x &key (k 0.5)) (* k x)) (defun forward (x) (helper (gradient (matmul x w2) x))) (defrun train :precision :bf16)
