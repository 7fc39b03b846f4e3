;; difftest seed=1 methods=forward(x);helper(x)
;; Under :f32 a frozen parameter read only inside bf16 regions is stored bf16, but the
;; public method helper reads t in f32 outside any region, so it must stay f32.
(defparam t (normal [4 4]) :trainable false)
(defun helper (x) (matmul x t))
(defun forward (x) (with-numerics (:precision :bf16) (matmul x t)))
(defrun train :precision :f32)
