;; Hugging Face transformers' MixtralForCausalLM (models/mixtral/modeling_mixtral.py, Apache
;; licence 2.0), with its state_dict: a checkpoint loads with strict=True, the experts' weights
;; as transformers 5 stores them (gate_up_proj [E 2I H], down_proj [E H I]). The constructor
;; takes MixtralConfig's names; the default rope, no sliding window, no KV cache, no padding
;; mask, no router jitter (a training-time noise, 0 by default). Each token goes through only
;; the num-experts-per-tok experts its router chose (sparse-experts: transformers' loop over
;; the chosen experts, each on its own tokens).

(defconst vocab-size 32000)
(defconst hidden-size 4096)
(defconst intermediate-size 14336)
(defconst num-hidden-layers 32)
(defconst num-attention-heads 32)
(defconst num-key-value-heads 8)
(defconst head-dim (// hidden-size num-attention-heads))
(defconst max-position-embeddings 131072 "unused: the rotary table is built for any length")
(defconst rms-norm-eps 1e-5)
(defconst rope-theta 1000000.0)
(defconst num-local-experts 8)
(defconst num-experts-per-tok 2)
(defconst pad-token-id none)

(defmodel linear-layer (&key (in-features 4096) (out-features 4096))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defun forward (x) (linear x weight)))

(defmodel embedding (&key (num-embeddings 32000) (embedding-dim 4096) (padding-idx none))
  (defparam weight (normal [num-embeddings embedding-dim] :std 0.02 :padding-idx padding-idx))
  (defun forward (ids) (take weight ids :padding-idx padding-idx)))

(defmodel mixtral-rms-norm (&key (dim 4096) (eps 1e-6))
  (defparam weight (ones [dim]))
  ;; f32 statistics and product, one rounding to x's dtype, the weight multiply in that dtype
  (defun forward (x)
    (* weight (with-numerics (:sensitivity :high)
                (* x (rsqrt (+ (mean (square x) :axes [-1] :keepdims true) eps)))))))

(defmodel mixtral-attention (&key (dim 4096) (heads 32) (kv-heads 32) (head-dim 128))
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

;; The router: logits, softmax in f32, the top k renormalized (in f32)
(defmodel mixtral-top-k-router (&key (num-experts 8) (dim 4096) (top-k 2))
  (defparam weight (normal [num-experts dim] :std 0.02))
  (defun forward (x)
    (let ((router-logits (linear x weight))
          (router-probs (softmax router-logits))
          ([top router-indices] (topk router-probs top-k)))
      [router-logits (/ top (sum top :axes [-1] :keepdims true)) router-indices])))

(defmodel mixtral-experts (&key (num-experts 8) (dim 4096) (hidden 14336))
  (defparam gate-up-proj (normal [num-experts (* 2 hidden) dim] :std 0.02))
  (defparam down-proj (normal [num-experts dim hidden] :std 0.02))
  (defun forward (x top-k-index top-k-weights)
    (sparse-experts x top-k-index top-k-weights gate-up-proj down-proj)))

(defmodel mixtral-sparse-moe-block (&key (num-experts 8) (dim 4096) (hidden 14336) (top-k 2))
  (defparam gate (mixtral-top-k-router :num-experts num-experts :dim dim :top-k top-k))
  (defparam experts (mixtral-experts :num-experts num-experts :dim dim :hidden hidden))
  (defun forward (x)
    (let ((flat (reshape x [-1 dim]))
          ([_ top-k-weights top-k-index] (gate flat)))
      (reshape-as (experts flat top-k-index top-k-weights) x))))

(defmodel mixtral-decoder-layer
    (&key (dim 4096) (hidden 14336) (heads 32) (kv-heads 8) (head-dim 128) (eps 1e-5)
          (num-experts 8) (top-k 2))
  (defparam self-attn (mixtral-attention :dim dim :heads heads :kv-heads kv-heads :head-dim head-dim))
  (defparam mlp (mixtral-sparse-moe-block :num-experts num-experts :dim dim :hidden hidden :top-k top-k))
  (defparam input-layernorm (mixtral-rms-norm :dim dim :eps eps))
  (defparam post-attention-layernorm (mixtral-rms-norm :dim dim :eps eps))
  (defun forward (x cos sin)
    (let ((x (+ x (self-attn (input-layernorm x) cos sin))))
      (+ x (mlp (post-attention-layernorm x))))))

(defmodel mixtral-model (&key (vocab 32000) (dim 4096) (hidden 14336) (depth 32) (heads 32)
                            (kv-heads 8) (head-dim 128) (eps 1e-5) (theta 1000000.0)
                            (num-experts 8) (top-k 2) (pad-token-id none))
  (defparam embed-tokens
    (embedding :num-embeddings vocab :embedding-dim dim :padding-idx pad-token-id))
  (defparam layers (stack depth (mixtral-decoder-layer :dim dim :hidden hidden :eps eps :heads heads
                                                     :kv-heads kv-heads :head-dim head-dim
                                                     :num-experts num-experts :top-k top-k)))
  (defparam norm (mixtral-rms-norm :dim dim :eps eps))
  ;; LlamaRotaryEmbedding: cos and sin computed in f32, rounded once to x's dtype
  (defun forward (input-ids)
    (let ((x (embed-tokens input-ids))
          (inv-freq (/ 1.0 (pow theta (/ (arange x 0 head-dim 2) head-dim))))
          (freqs (outer (arange-of x :axis 1) inv-freq))
          (emb (concat [freqs freqs] :axis -1)))
      (norm (chain layers x (cast-run (cos emb)) (cast-run (sin emb)))))))

(defparam model (mixtral-model :vocab vocab-size :dim hidden-size :hidden intermediate-size
                             :depth num-hidden-layers :heads num-attention-heads :eps rms-norm-eps
                             :kv-heads num-key-value-heads :head-dim head-dim :theta rope-theta
                             :num-experts num-local-experts :top-k num-experts-per-tok
                             :pad-token-id pad-token-id))
(defparam lm-head (linear-layer :in-features hidden-size :out-features vocab-size))

(defun forward (input-ids) (lm-head (model input-ids)))

(defun loss (input-ids targets)
  (cross-entropy (reshape (forward input-ids) [-1 vocab-size]) (reshape targets [-1])))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
