;; difftest seed=100006 methods=forward(x,ids)
;; Found by the campaign (seed 100006), minimized: (at w2 3) of a matrix is a row, which
;; decides the dtype: under :bf16, maximum of the f32 input and that bf16 row is bf16.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
(defconst d 4)
(defparam w2 (normal [d d]))
(defun forward (x ids) (maximum x (at w2 3)))
(defrun train :precision :bf16)
