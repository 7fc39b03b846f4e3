;; Views as model files write them: GPT-J's interleaved rotary pairs (x[..., 0::2] and
;; x[..., 1::2]), grouped-query attention's repeated key heads (repeat_interleave), a
;; Swin-style cyclic shift (roll), heads merged back with flatten, a batch axis added
;; and taken away. Each is the torch call, and none rounds under :bf16.
(defconst heads 4)
(defconst kv-heads 2)
(defconst head-dim 4)
(defparam wq (normal [16 16]))
(defparam wk (normal [8 16]))
(defun rotate-pairs (x cos sin)
  (let ((even (slice x :axis -1 :step 2))
        (odd (slice x :axis -1 :start 1 :step 2)))
    (concat [(- (* even cos) (* odd sin)) (+ (* odd cos) (* even sin))] :axis -1)))
(defun forward (x cos sin)
  (let ((q (transpose (reshape (linear x wq) [0 0 heads head-dim]) [0 2 1 3]))
        (k (transpose (reshape (linear x wk) [0 0 kv-heads head-dim]) [0 2 1 3]))
        (k (repeat-interleave k :repeats (// heads kv-heads) :axis 1))
        (scores (matmul (rotate-pairs q cos sin)
                        (swap-axes (rotate-pairs k cos sin) -1 -2)))
        (shifted (roll scores :shifts 1 :axis -1)))
    (squeeze (unsqueeze (flatten (transpose shifted [0 2 1 3]) :start 2) :axis 0) :axis 0)))
(defun key-gradient (x cos sin)
  (gradient (sum (forward x cos sin)) wk))
(defrun train :precision :bf16)
