;; difftest seed=1000150 methods=forward(x,ids)
;; Found by the campaign (seed 1000150), minimized: two 0-d values, the f32 full reduction
;; (amax ...) and the bf16 element (at v 3), decide between themselves as two tensors do
;; (docs/LANGUAGE.md): bf16 under :bf16, the f32 one rounded before the sum, as the compiler
;; writes it. The interpreter took torch's promotion of two 0-d tensors (f32) instead: its bug,
;; fixed there. (w2 is unused: it keeps the seed's data as found.)
;; found: value cuda:forward: max |diff| 0.0718 (interpreter: f32 sum of 0-d operands)
(defconst d 4)
(defparam w2 (normal [d d]))
(defparam v (normal [d]))
(defun forward (x ids) (+ (amax (+ x x)) (at v 3)))
(defrun train :precision :bf16)
