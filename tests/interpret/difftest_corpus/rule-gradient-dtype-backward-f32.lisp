;; difftest seed=1061208 methods=forward(x,ids)
;; Found by the campaign at b3f533d (seed 1061208), minimized: the gradient of a frozen v that a bf16
;; matmul reads. The module computes it as the rules say, in the dtype its last backward node
;; computes in: x^T @ g reads no parameter and no bf16 value, so f32; the interpreter gives a
;; gradient the join of the dtypes X is read in (bf16), and (+ (at v 3) ...) then rounds.
;; found: value cuda:forward: max |diff| 2.52: got [1.6875, 1.1875, 0.21875, 1.8125, 0.9375, 0.6875], want [1.6875, 1.1875, 0.21875, -0.703125, 0.9375, 0.6875]
;; Passes since the interpreter's backward is symbolic (sx2torch/interpret/backward.py): each backward
;; node typed by the rules, in its forward node's marks.
(defconst d 4)
(defparam w1 (normal [d d]))
(defparam w2 (normal [d d]) :trainable false)
(defparam v (normal [d]) :trainable false)
(defparam table (normal [8 d]))
(defun forward (x ids) (< (neg (- (linear x w2) x)) (sum (+ (at v 3) (gradient (mean (matmul x v)) v)))))
(defrun train :precision :bf16)
