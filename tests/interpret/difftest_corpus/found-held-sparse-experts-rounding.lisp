;; difftest seed=1211015 methods=forward(x,ids)
;; Found by h-interp's gradient campaign (seed 1211015), minimized: the held targets (metal, cpu) call
;; sx.sparse_experts on f32 tensors holding bf16 values, so every op inside it computes in f32 and the
;; result is rounded once; cuda's bf16 call rounds each linear, the SiLU, the products and each
;; addition, as docs/OPS.md says and the interpreter computes. One bf16 ulp of a value near 35, through
;; sin, moves the result by up to 1.5.
;; found: value metal:forward, cpu:forward: max |diff| 0.236 in this form, 1.5 in the campaign's program (targets
;; too); cuda and the interpreter agree
;; fixed: on the held targets under bf16 the generated call passes held=True, and sx.sparse_experts
;; rounds each op (sx.store_bf16) as cuda's bf16 ops do.
(defconst d 4) (defmodel blk (&key (d 4)) (defun forward (x) x)) (defparam blocks (stack 2 (blk :d d))) (defparam w2 (normal [d d]) :trainable false) (defparam table (normal [8 d]) :trainable false) (defparam wr (normal [d 2])) (defparam gu (normal [2 4 d])) (defparam dn (normal [2 d 2])) (defun forward (x ids) (sin (let (([tv ti] (topk (for (layer blocks) ((c x)) (* c x)) 1))) (sparse-experts (for (layer blocks) ((c x)) (* c x)) ti tv gu dn)))) (defrun train :precision :bf16)

