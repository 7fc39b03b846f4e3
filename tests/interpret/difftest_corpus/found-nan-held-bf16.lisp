;; difftest seed=1057364 methods=forward(x,ids)
;; Minimized from the campaign at b3f533d: the held targets give NaN, as the interpreter does; the checker took a NaN for a bf16 value held in f32 that is not rounded (a NaN is not equal to itself).
;; found: dtype metal:forward: a bf16 value held in f32 that is not rounded to bf16
(defconst d 4)
(defmodel blk (&key (d 4))
(defparam w (normal [d d]) :trainable false)
(defun forward (x) (square (+ (matmul x w) (* x x)))))
(defparam sub (blk :d d))
(defparam blocks (stack 2 (blk :d d)))
(defun forward (x ids) (for (layer blocks) ((c (chain blocks x))) (layer (* c c))))
(defrun train :precision :bf16)
