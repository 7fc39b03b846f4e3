;; A stack whose layers are called one by one through nth, the first twice.
(defconst vocab 64)
(defconst d 32)

(defmodel layer (&key (d 32))
  (defparam w (normal [d d] :std 0.1))
  (defparam g (ones [d]))
  (defun forward (x) (+ x (* (tanh (matmul x w)) g))))

(defparam wte (normal [vocab d] :std 0.02))
(defparam layers (stack 3 (layer :d d)))
(defparam lm-head (normal [d vocab] :std 0.02))

(defun forward (idx)
  (let ((x (take wte idx))
        (x (nth layers 0 x))
        (x (nth layers 2 x))
        (x (nth layers 1 x))
        (x (nth layers 0 x)))
    (matmul x lm-head :out :f32)))

(defun loss (idx targets)
  (cross-entropy (reshape (forward idx) [-1 vocab]) (reshape targets [-1])))

(defrun train :precision :bf16 :loss loss :optimizer (adamw :lr 0.003)
  :steps 6 :batch-size 4 :seq-len 16)
