;; difftest seed=1306294 methods=forward(x,ids)
;; Found by the campaign on main (seed 1306294), minimized: a subtraction of a constant in an f32
;; island, read by a bf16 matmul, under :bf16. Its derivative is the gradient itself, which the
;; compiler passes on with no backward node (bf16); the interpreter made that pass-through a node
;; in the island's marks (f32). The rule (docs/LANGUAGE.md, gradient): a derivative that is the
;; gradient itself is no backward node and carries no marks, so the gradient stays bf16.
;; found: dtype cuda:forward: got torch.bfloat16 (2, 4), want torch.float32 (2, 4)
(defconst d 4) (defmodel blk (&key (d 4)) (defparam w (normal [d d])) (defun forward (x &key (k 1.0)) (matmul x w))) (defparam sub (blk :d d)) (defun forward (x ids) (gradient (sum (sub (with-numerics (:sensitivity :high) (- x 0.5)) :k 3.0)) x)) (defrun train :precision :bf16)
