;; difftest seed=3001295 methods=forward(x,keep);helper(x)
;; found: value cuda:forward: max |diff| 0.555 (a 0/1 additive mask for the booleans)
;; found: run metal:forward: TypeError: round_to_bf16 takes a float32 or bfloat16 tensor, got torch.bool
;; A boolean argument as its caller passes it (issue 38): `keep`, sliced, is attention's
;; mask under :bf16, which the module cast with .to(torch.bfloat16) into an additive 0/1
;; mask (the held targets raised); a cast of it now converts a float only (sx.mask_as).
(defconst d 4)
(defparam w2 (normal [d d]) :trainable false)
(defun helper (x) (* x 2.0))
(defun forward (x keep) (attention (matmul x w2) x x (slice keep :axis 1 :end 2)))
(defrun train :precision :bf16)
