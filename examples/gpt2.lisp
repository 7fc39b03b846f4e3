;; Hugging Face transformers' GPT2LMHeadModel (models/gpt2/modeling_gpt2.py, Apache licence
;; 2.0), with its state_dict: a checkpoint loads with strict=True. The constructor takes
;; GPT2Config's names; learned positions for any length up to n_positions, lm_head tied to
;; the token embedding; no KV cache, no padding mask, no dropout (the model in eval mode).

(defconst vocab-size 50257)
(defconst n-positions 1024)
(defconst n-embd 768)
(defconst n-layer 12)
(defconst n-head 12)
(defconst n-inner (* 4 n-embd) "GPT2Config's None: 4 * n_embd")
(defconst layer-norm-epsilon 1e-5)

(defmodel conv1d (&key (nf 768) (nx 768))
  "transformers' Conv1D: a linear layer whose weight is stored [in, out], addmm(bias, x, w)"
  (defparam weight (normal [nx nf] :std 0.02))
  (defparam bias (zeros [nf]))
  (defun forward (x) (linear x (transpose weight [1 0]) bias)))

(defmodel linear-layer (&key (in-features 768) (out-features 50257))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defun forward (x) (linear x weight)))

(defmodel embedding (&key (num-embeddings 50257) (embedding-dim 768))
  (defparam weight (normal [num-embeddings embedding-dim] :std 0.02))
  (defun forward (ids) (take weight ids)))

;; NewGELUActivation (ACT2FN["gelu_new"]) as it is written, rounding after each op in bf16
(defun gelu-new (x)
  (* 0.5 x (+ 1.0 (tanh (* (sqrt (/ 2.0 3.141592653589793))
                           (+ x (* 0.044715 (pow x 3.0))))))))

(defmodel gpt2-attention (&key (embed-dim 768) (num-heads 12))
  (defparam c-attn (conv1d :nf (* 3 embed-dim) :nx embed-dim))
  (defparam c-proj (conv1d :nf embed-dim :nx embed-dim))
  (defun split-heads (x) (transpose (reshape x [0 0 -1 (// embed-dim num-heads)]) [0 2 1 3]))
  (defun forward (hidden-states)
    (let ((qkv (c-attn hidden-states))
          (query (split-heads (slice qkv :axis -1 :end embed-dim)))
          (key (split-heads (slice qkv :axis -1 :start embed-dim :end (* 2 embed-dim))))
          (value (split-heads (slice qkv :axis -1 :start (* 2 embed-dim))))
          (attn-output (attention query key value :causal true)))
      (c-proj (reshape (transpose attn-output [0 2 1 3]) [0 0 -1])))))

(defmodel gpt2-mlp (&key (intermediate-size 3072) (embed-dim 768))
  (defparam c-fc (conv1d :nf intermediate-size :nx embed-dim))
  (defparam c-proj (conv1d :nf embed-dim :nx intermediate-size))
  (defun forward (hidden-states) (c-proj (gelu-new (c-fc hidden-states)))))

(defmodel gpt2-block (&key (hidden-size 768) (inner-dim 3072) (num-heads 12) (eps 1e-5))
  (defparam ln-1 (LayerNorm hidden-size :eps eps))
  (defparam attn (gpt2-attention :embed-dim hidden-size :num-heads num-heads))
  (defparam ln-2 (LayerNorm hidden-size :eps eps))
  (defparam mlp (gpt2-mlp :intermediate-size inner-dim :embed-dim hidden-size))
  (defun forward (hidden-states)
    (let ((hidden-states (+ (attn (ln-1 hidden-states)) hidden-states)))
      (+ hidden-states (mlp (ln-2 hidden-states))))))

(defmodel gpt2-model (&key (vocab-size 50257) (n-positions 1024) (n-embd 768) (n-layer 12)
                           (n-head 12) (n-inner 3072) (eps 1e-5))
  (defparam wte (embedding :num-embeddings vocab-size :embedding-dim n-embd))
  (defparam wpe (embedding :num-embeddings n-positions :embedding-dim n-embd))
  (defparam h (stack n-layer (gpt2-block :hidden-size n-embd :inner-dim n-inner
                                         :num-heads n-head :eps eps)))
  (defparam ln-f (LayerNorm n-embd :eps eps))
  (defun forward (input-ids)
    (let ((hidden-states (+ (wte input-ids) (wpe (positions input-ids :axis 1)))))
      (ln-f (chain h hidden-states)))))

(defparam transformer (gpt2-model :vocab-size vocab-size :n-positions n-positions
                                  :n-embd n-embd :n-layer n-layer :n-head n-head
                                  :n-inner n-inner :eps layer-norm-epsilon))
(defparam lm-head (linear-layer :in-features n-embd :out-features vocab-size))
(tie lm-head.weight transformer.wte.weight)

(defun forward (input-ids) (lm-head (transformer input-ids)))

(defun loss (input-ids targets)
  (cross-entropy (reshape (forward input-ids) [-1 vocab-size]) (reshape targets [-1])))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
