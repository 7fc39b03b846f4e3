;; A pre-LayerNorm GPT-2 with a tied head: each block calls sub-models in sequence, one
;; through a defun of its own, and the head reads the embedding sub-model's weight.
(defconst vocab 64)
(defconst d 32)
(defconst n-head 2)
(defconst n-layer 2)

(defmodel ln (&key (d 32))
  (defparam g (ones [d]))
  (defparam b (zeros [d]))
  (defun forward (x) (+ (* (layer-norm x) g) b)))

(defmodel attn (&key (d 32) (n-head 2))
  (defparam w-qkv (normal [d (* 3 d)] :std 0.02))
  (defparam w-o (normal [d d] :std 0.02))
  (defun heads (x) (transpose (reshape x [0 0 n-head (// d n-head)]) [0 2 1 3]))
  (defun forward (x)
    (let ((qkv (matmul x w-qkv))
          (q (heads (slice qkv :axis -1 :start 0 :end d)))
          (k (heads (slice qkv :axis -1 :start d :end (* 2 d))))
          (v (heads (slice qkv :axis -1 :start (* 2 d) :end (* 3 d))))
          (y (causal-attention q k v)))
      (matmul (reshape (transpose y [0 2 1 3]) [0 0 -1]) w-o))))

(defmodel mlp (&key (d 32))
  (defparam w-up (normal [d (* 4 d)] :std 0.02))
  (defparam w-down (normal [(* 4 d) d] :std 0.02))
  (defun forward (x) (matmul (gelu (matmul x w-up)) w-down)))

(defmodel block (&key (d 32) (n-head 2))
  (defparam ln1 (ln :d d))
  (defparam attn (attn :d d :n-head n-head))
  (defparam ln2 (ln :d d))
  (defparam mlp (mlp :d d))
  (defun attend (x) (attn (ln1 x)))
  (defun forward (x)
    (let ((x (+ x (attend x))))
      (+ x (mlp (ln2 x))))))

(defmodel embedding (&key (vocab 64) (d 32))
  (defparam weight (normal [vocab d] :std 0.02))
  (defun forward (idx) (take weight idx)))

(defparam wte (embedding :vocab vocab :d d))
(defparam wpe (normal [16 d] :std 0.01))
(defparam blocks (stack n-layer (block :d d :n-head n-head)))
(defparam ln-f (ln :d d))

(defun forward (idx)
  (let ((x (+ (wte idx) wpe))
        (x (chain blocks x)))
    (matmul (ln-f x) (transpose wte.weight [1 0]) :out :f32)))

(defun loss (idx targets)
  (cross-entropy (reshape (forward idx) [-1 vocab]) (reshape targets [-1])))

(defrun train :precision :bf16 :loss loss
  :optimizer (adamw :lr 0.003)
  :steps 6 :batch-size 4 :seq-len 16)
