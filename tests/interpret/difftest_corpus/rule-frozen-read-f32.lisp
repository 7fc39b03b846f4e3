;; difftest seed=2 methods=forward(x);helper(x)
;; Issue 26, known miscompile 4 (passes on this branch in this form): a frozen parameter read in f32 anywhere stays f32: the public method helper reads t in
;; an island, so t must not be stored (rounded) in bf16 for forward's sake.
(defparam t (normal [4 4]) :trainable false)
(defun helper (x) (with-numerics (:sensitivity :high) (matmul x t)))
(defun forward (x) (matmul x t))
(defrun train :precision :bf16)
