;; difftest seed=1052243 methods=forward(x,ids)
;; Found by replaying the b3f533d campaign's programs (seed 1052243, that commit's generator) on
;; main, minimized: a loop whose carried value c starts as (matmul x w2), a frozen w2 stored bf16,
;; and which no iteration reads. The adjoint loop left zeros for the start, whose backward (a bf16
;; product with w2) then made x's gradient bf16; the interpreter, which unrolls the loop, sees no
;; read of the start. A start no iteration reads now gets no contribution: f32.
;; found: dtype cuda:forward: got torch.bfloat16 (2, 4), want torch.float32 (2, 4)
(defconst d 4) (defmodel blk (&key (d 4) (idx 0)) (defun forward (x) x)) (defparam blocks (stack (i 2) (blk :d d :idx i))) (defparam w2 (normal [d d]) :trainable false) (defun forward (x ids) (gradient (mean (for (layer blocks) ((c (matmul x w2))) x)) x)) (defrun train :precision :bf16)
