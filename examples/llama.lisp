;; Hugging Face transformers' LlamaForCausalLM (models/llama/modeling_llama.py, Apache
;; licence 2.0), with its state_dict: a checkpoint loads with strict=True. The constructor
;; takes LlamaConfig's names; the default rope, no biases, no KV cache, no padding mask.

(defconst vocab-size 32000)
(defconst hidden-size 4096)
(defconst intermediate-size 11008)
(defconst num-hidden-layers 32)
(defconst num-attention-heads 32)
(defconst num-key-value-heads 32)
(defconst head-dim (// hidden-size num-attention-heads))
(defconst max-position-embeddings 2048 "unused: the rotary table is built for any length")
(defconst rms-norm-eps 1e-6)
(defconst rope-theta 10000.0)
(defconst pad-token-id none)

(defmodel linear-layer (&key (in-features 4096) (out-features 4096))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defun forward (x) (linear x weight)))

(defmodel embedding (&key (num-embeddings 32000) (embedding-dim 4096) (padding-idx none))
  (defparam weight (normal [num-embeddings embedding-dim] :std 0.02 :padding-idx padding-idx))
  (defun forward (ids) (take weight ids :padding-idx padding-idx)))

(defmodel llama-rms-norm (&key (dim 4096) (eps 1e-6))
  (defparam weight (ones [dim]))
  ;; f32 statistics and product, one rounding to x's dtype, the weight multiply in that dtype
  (defun forward (x)
    (* weight (with-numerics (:sensitivity :high)
                (* x (rsqrt (+ (mean (square x) :axes [-1] :keepdims true) eps)))))))

(defmodel llama-attention (&key (dim 4096) (heads 32) (kv-heads 32) (head-dim 128))
  (defparam q-proj (linear-layer :in-features dim :out-features (* heads head-dim)))
  (defparam k-proj (linear-layer :in-features dim :out-features (* kv-heads head-dim)))
  (defparam v-proj (linear-layer :in-features dim :out-features (* kv-heads head-dim)))
  (defparam o-proj (linear-layer :in-features (* heads head-dim) :out-features dim))
  (defun split-heads (x) (transpose (reshape x [0 0 -1 head-dim]) [0 2 1 3]))
  (defun rotate-half (x &key (half (// head-dim 2)))
    (concat [(- (slice x :axis -1 :start half)) (slice x :axis -1 :end half)] :axis -1))
  (defun apply-rotary-pos-emb (x cos sin) (+ (* x cos) (* (rotate-half x) sin)))
  (defun forward (x cos sin)
    (let ((q (apply-rotary-pos-emb (split-heads (q-proj x)) cos sin))
          (k (apply-rotary-pos-emb (split-heads (k-proj x)) cos sin))
          (y (attention q k (split-heads (v-proj x)) :causal true :enable-gqa true)))
      (o-proj (reshape (transpose y [0 2 1 3]) [0 0 -1])))))

(defmodel llama-mlp (&key (dim 4096) (hidden 11008))
  (defparam gate-proj (linear-layer :in-features dim :out-features hidden))
  (defparam up-proj (linear-layer :in-features dim :out-features hidden))
  (defparam down-proj (linear-layer :in-features hidden :out-features dim))
  (defun forward (x) (down-proj (* (silu (gate-proj x)) (up-proj x)))))

(defmodel llama-decoder-layer
    (&key (dim 4096) (hidden 11008) (heads 32) (kv-heads 32) (head-dim 128) (eps 1e-6))
  (defparam self-attn (llama-attention :dim dim :heads heads :kv-heads kv-heads :head-dim head-dim))
  (defparam mlp (llama-mlp :dim dim :hidden hidden))
  (defparam input-layernorm (llama-rms-norm :dim dim :eps eps))
  (defparam post-attention-layernorm (llama-rms-norm :dim dim :eps eps))
  (defun forward (x cos sin)
    (let ((x (+ x (self-attn (input-layernorm x) cos sin))))
      (+ x (mlp (post-attention-layernorm x))))))

(defmodel llama-model (&key (vocab 32000) (dim 4096) (hidden 11008) (depth 32) (heads 32)
                            (kv-heads 32) (head-dim 128) (eps 1e-6) (theta 10000.0) (pad none))
  (defparam embed-tokens (embedding vocab dim pad))
  (defparam layers (stack depth (llama-decoder-layer :dim dim :hidden hidden :eps eps :heads heads
                                                     :kv-heads kv-heads :head-dim head-dim)))
  (defparam norm (llama-rms-norm :dim dim :eps eps))
  ;; LlamaRotaryEmbedding: inv_freq computed once, an f32 buffer out of state_dict, read in
  ;; f32; cos and sin computed in f32, rounded once to x's dtype
  (defparam inv-freq (/ 1.0 (pow theta (/ (arange 0 head-dim 2) head-dim)))
    :numerics :high :trainable false :persistent false)
  (defun forward (input-ids)
    (let ((freqs (* (unsqueeze (arange-of input-ids :axis 1) :axis -1) inv-freq))
          (x (embed-tokens input-ids))
          (emb (unsqueeze (concat [freqs freqs] :axis -1) :axis -3)))
      (norm (chain layers x (cast-run (cos emb)) (cast-run (sin emb)))))))

(defparam model (llama-model :vocab vocab-size :dim hidden-size :hidden intermediate-size
                             :depth num-hidden-layers :heads num-attention-heads :eps rms-norm-eps
                             :kv-heads num-key-value-heads :head-dim head-dim :theta rope-theta
                             :pad pad-token-id))
(defparam lm-head (linear-layer :in-features hidden-size :out-features vocab-size))

(defun forward (input-ids) (lm-head (model input-ids)))

(defun loss (input-ids targets)
  (cross-entropy (reshape (forward input-ids) [-1 vocab-size]) (reshape targets [-1])))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
