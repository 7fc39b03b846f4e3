;; difftest seed=1028094 methods=forward(x,ids)
;; Found by the campaign (seed 1028094), minimized: a `:dtype :bf16` table read by `take`
;; under :f32. The module gathered, then widened (`self.table[ids].float()`), so the cast's
;; backward rounded each row's gradient to bf16 and the gather's backward summed repeated
;; ids in bf16: one entry 0.0 where autograd on the interpreter (widen, then gather) gives
;; -0.25. A widening read now casts the table first, as the held targets do, so the rows are
;; summed in f32 and rounded once.
;; found: backward cuda:forward: table: max |diff| 0.25
(defconst d 4) (defmodel blk (&key (d 4) (idx 0)) (defparam w (normal [d d])) (defun forward (x) x)) (defparam sub (blk :d d)) (defparam blocks (stack (i 2) (blk :d d :idx i))) (defparam w1 (normal [d d]) :numerics :high) (defparam w2 (normal [d d])) (defparam v (normal [d])) (defparam table (normal [8 d]) :dtype :bf16) (defun helper (x &key (k 0.5)) (* (+ x 2.0) (sum x))) (defun forward (x ids) (square (concat [(slice (- (helper (take table ids) :k 0.5) -1.5) :axis 1 :start 2) (slice (- (helper (take table ids) :k 0.5) -1.5) :axis 1 :end 2)] :axis 1)))
