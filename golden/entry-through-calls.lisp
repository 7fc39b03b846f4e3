;; A value rounded once by its maker and passed down through a public method to the
;; defun that reads it: the public method casts it at entry for callers from outside,
;; and one method serves both (LlamaRotaryEmbedding's cos and sin).
(defmodel rotary (&key (d 8))
  (defparam w (normal [d d] :std 0.02))
  (defun mix (x c) (* x c))
  (defun forward (x c) (mix (matmul x w) c)))

(defparam block (rotary :d 8))

(defun forward (x angle) (block x (cast-run (cos angle))))

(defrun train :precision :bf16)
