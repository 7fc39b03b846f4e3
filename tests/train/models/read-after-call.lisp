;; A block's own parameters read by a defun after a sub-model call.
(defconst vocab 64)
(defconst d 32)

(defmodel mlp (&key (d 32))
  (defparam w-up (normal [d (* 4 d)] :std 0.02))
  (defparam w-down (normal [(* 4 d) d] :std 0.02))
  (defun forward (x) (matmul (gelu (matmul x w-up)) w-down)))

(defmodel block (&key (d 32))
  (defparam g (ones [d]))
  (defparam b (zeros [d]))
  (defparam mlp (mlp :d d))
  (defparam w (normal [d d] :std 0.02))
  (defun norm (x) (+ (* (layer-norm x) g) b))
  (defun forward (x)
    (let ((h (+ x (mlp (norm x)))))
      (+ h (matmul (norm h) w)))))

(defparam wte (normal [vocab d] :std 0.02))
(defparam blocks (stack 2 (block :d d)))
(defparam lm-head (normal [d vocab] :std 0.02))

(defun forward (idx)
  (matmul (chain blocks (take wte idx)) lm-head :out :f32))

(defun loss (idx targets)
  (cross-entropy (reshape (forward idx) [-1 vocab]) (reshape targets [-1])))

(defrun train :precision :bf16 :loss loss :optimizer (adamw :lr 0.003)
  :steps 6 :batch-size 4 :seq-len 16)
