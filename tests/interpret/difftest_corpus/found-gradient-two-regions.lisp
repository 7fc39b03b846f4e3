;; difftest seed=1052988 methods=forward(x,ids)
;; Minimized from the campaign at b3f533d: x read by two bf16 regions under :f32 gets its gradient summed with the marks its readers share (bf16, in a region), as X read twice in one region does; the two regions were different frames, so the sum ran in f32.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
(defconst d 4)
(defparam w2 (normal [d d]))
(defun forward (x ids) (gradient (mean (concat [(with-numerics (:precision :bf16) (matmul x w2)) (with-numerics (:precision :bf16) (matmul x w2))] :axis 1)) x))
