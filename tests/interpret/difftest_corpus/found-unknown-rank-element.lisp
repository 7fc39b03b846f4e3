;; difftest seed=1010183 methods=forward(x,ids)
;; Found by the campaign (seeds 1010183, 1007673, 1007846, 1028248, 1028636), minimized: an
;; element of a value whose rank depends on an entry point's argument. The rule (LANGUAGE.md,
;; Expressions): a rank not known when the file compiles is treated as having axes, so
;; `(at (+ (sum x :axes [0]) v) 3)` decides the dtype of the `-`: bf16 (contagion from v),
;; as the compiler writes it. The interpreter took the rank the tensor has when it runs
;; (x is [2 4], so the element is 0-d) and gave f32; it now marks an entry point's
;; arguments, and what is made from them, as of a rank not known (a full reduction's, a
;; reshape's and a parameter's are known).
;; found: dtype cuda:forward: got torch.bfloat16 (2, 4), want torch.float32 (2, 4)
(defconst d 4)
(defparam v (normal [d]))
(defun forward (x ids) (- (at (+ (sum x :axes [0]) v) 3) x))
(defrun train :precision :bf16)
