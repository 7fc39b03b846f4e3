;; Hugging Face transformers' DeepseekV3ForCausalLM (models/deepseek_v3/modeling_deepseek_v3.py,
;; Apache licence 2.0), with its state_dict: a checkpoint loads with strict=True. The
;; constructor takes DeepseekV3Config's names; multi-head latent attention with q_lora_rank
;; set and the interleaved rotary (rope_interleave, the default rope), a dense MLP on the first
;; first-k-dense-replace layers and the grouped top-k MoE on the others (the choice under
;; `mlp`), no KV cache, no padding mask.

(defconst vocab-size 129280)
(defconst hidden-size 7168)
(defconst intermediate-size 18432)
(defconst moe-intermediate-size 2048)
(defconst num-hidden-layers 61)
(defconst num-attention-heads 128)
(defconst n-shared-experts 1)
(defconst n-routed-experts 256)
(defconst routed-scaling-factor 2.5)
(defconst kv-lora-rank 512)
(defconst q-lora-rank 1536)
(defconst qk-rope-head-dim 64)
(defconst v-head-dim 128)
(defconst qk-nope-head-dim 128)
(defconst n-group 8)
(defconst topk-group 4)
(defconst num-experts-per-tok 8)
(defconst first-k-dense-replace 3)
(defconst norm-topk-prob true)
(defconst rms-norm-eps 1e-6)
(defconst rope-theta 10000.0)
(defconst pad-token-id none)

(defmodel linear-layer (&key (in-features 7168) (out-features 7168))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defun forward (x) (linear x weight)))

(defmodel embedding (&key (num-embeddings 129280) (embedding-dim 7168) (padding-idx none))
  (defparam weight (normal [num-embeddings embedding-dim] :std 0.02 :padding-idx padding-idx))
  (defun forward (ids) (take weight ids :padding-idx padding-idx)))

(defmodel deepseek-v3-rms-norm (&key (dim 7168) (eps 1e-6))
  (defparam weight (ones [dim]))
  (defun forward (x)
    (* weight (with-numerics (:sensitivity :high)
                (* x (rsqrt (+ (mean (square x) :axes [-1] :keepdims true) eps)))))))

(defmodel deepseek-v3-mlp (&key (dim 7168) (hidden 18432))
  (defparam gate-proj (linear-layer :in-features dim :out-features hidden))
  (defparam up-proj (linear-layer :in-features dim :out-features hidden))
  (defparam down-proj (linear-layer :in-features hidden :out-features dim))
  (defun forward (x) (down-proj (* (silu (gate-proj x)) (up-proj x)))))

;; sigmoid scores in f32; the best top-k-group groups by their two best scores, then the
;; top k experts of those, renormalized and scaled, all in f32
(defmodel deepseek-v3-topk-router (&key (num-experts 256) (dim 7168) (top-k 8) (n-group 8)
                                        (topk-group 4) (norm true) (scaling 2.5))
  (defparam weight (normal [num-experts dim] :std 0.02))
  (defparam e-score-correction-bias (zeros [num-experts]) :trainable false)
  (defun forward (x)
    (with-numerics (:sensitivity :high)
      (let ((scores (sigmoid (linear x weight)))
            (for-choice (+ scores e-score-correction-bias))
            ([best _] (topk (reshape for-choice [0 n-group -1]) 2))
            ([_ group-idx] (topk (sum best :axes [-1]) topk-group :sorted false))
            (group-mask (sum (one-hot group-idx n-group) :axes [1]))
            (score-mask (repeat-interleave group-mask :repeats (// num-experts n-group) :axis -1))
            ([_ topk-indices] (topk (where (> score-mask 0) for-choice -inf) top-k :sorted false))
            (topk-weights (gather scores topk-indices))
            (weights (if norm
                         (/ topk-weights (+ (sum topk-weights :axes [-1] :keepdims true) 1e-20))
                         topk-weights)))
        [(* weights scaling) topk-indices]))))

(defmodel deepseek-v3-experts (&key (num-experts 256) (dim 7168) (hidden 2048))
  (defparam gate-up-proj (normal [num-experts (* 2 hidden) dim] :std 0.02))
  (defparam down-proj (normal [num-experts dim hidden] :std 0.02))
  (defun forward (x top-k-index top-k-weights)
    (sparse-experts x top-k-index top-k-weights gate-up-proj down-proj)))

(defmodel deepseek-v3-mo-e (&key (num-experts 256) (dim 7168) (hidden 2048) (shared 1) (top-k 8)
                                 (n-group 8) (topk-group 4) (norm true) (scaling 2.5))
  (defparam experts (deepseek-v3-experts :num-experts num-experts :dim dim :hidden hidden))
  (defparam gate (deepseek-v3-topk-router :num-experts num-experts :dim dim :top-k top-k
                                          :n-group n-group :topk-group topk-group :norm norm
                                          :scaling scaling))
  (defparam shared-experts (deepseek-v3-mlp :dim dim :hidden (* hidden shared)))
  (defun forward (x)
    (let ((flat (reshape x [-1 dim]))
          ([topk-weights topk-indices] (gate flat)))
      (+ (reshape-as (experts flat topk-indices topk-weights) x) (shared-experts x)))))

;; multi-head latent attention: queries and keys-values through low-rank latents, the rotary
;; part of each key shared by the heads
(defmodel deepseek-v3-attention (&key (dim 7168) (heads 128) (q-rank 1536) (kv-rank 512)
                                      (rope-dim 64) (nope-dim 128) (v-dim 128))
  (defparam q-a-proj (linear-layer :in-features dim :out-features q-rank))
  (defparam q-a-layernorm (deepseek-v3-rms-norm :dim q-rank))
  (defparam q-b-proj (linear-layer :in-features q-rank :out-features (* heads (+ nope-dim rope-dim))))
  (defparam kv-a-proj-with-mqa (linear-layer :in-features dim :out-features (+ kv-rank rope-dim)))
  (defparam kv-a-layernorm (deepseek-v3-rms-norm :dim kv-rank))
  (defparam kv-b-proj (linear-layer :in-features kv-rank :out-features (* heads (+ nope-dim v-dim))))
  (defparam o-proj (linear-layer :in-features (* heads v-dim) :out-features dim))
  (defun split-heads (x) (transpose (reshape x [0 0 heads -1]) [0 2 1 3]))
  ;; apply_rotary_pos_emb_interleave: the pairs (x0, x1), (x2, x3), ... each by one angle
  (defun rotate (x cos sin)
    (let ((x1 (slice x :axis -1 :step 2))
          (x2 (slice x :axis -1 :start 1 :step 2)))
      (concat [(- (* x1 cos) (* x2 sin)) (+ (* x2 cos) (* x1 sin))] :axis -1)))
  (defun forward (x cos sin)
    (let ((q (split-heads (q-b-proj (q-a-layernorm (q-a-proj x)))))
          (q-rot (rotate (slice q :axis -1 :start nope-dim) cos sin))
          (compressed (kv-a-proj-with-mqa x))
          (kv (split-heads (kv-b-proj (kv-a-layernorm (slice compressed :axis -1 :end kv-rank)))))
          (k-rot (rotate (unsqueeze (slice compressed :axis -1 :start kv-rank) :axis 1) cos sin))
          (query (concat [(slice q :axis -1 :end nope-dim) q-rot] :axis -1))
          (key (concat [(slice kv :axis -1 :end nope-dim) (expand-as k-rot q-rot)] :axis -1))
          (y (attention query key (slice kv :axis -1 :start nope-dim) :causal true
                        :scale (** (+ nope-dim rope-dim) -0.5))))
      (o-proj (reshape (transpose y [0 2 1 3]) [0 0 -1])))))

(defmodel deepseek-v3-decoder-layer
    (&key (dim 7168) (hidden 18432) (moe-hidden 2048) (heads 128) (q-rank 1536) (kv-rank 512)
          (rope-dim 64) (nope-dim 128) (v-dim 128) (eps 1e-6) (layer-idx 0) (first-dense 3)
          (num-experts 256) (shared 1) (top-k 8) (n-group 8) (topk-group 4) (norm true)
          (scaling 2.5))
  (defparam self-attn (deepseek-v3-attention :dim dim :heads heads :q-rank q-rank
                                             :kv-rank kv-rank :rope-dim rope-dim
                                             :nope-dim nope-dim :v-dim v-dim))
  (defparam mlp (if (>= layer-idx first-dense)
                    (deepseek-v3-mo-e :num-experts num-experts :dim dim :hidden moe-hidden
                                      :shared shared :top-k top-k :n-group n-group
                                      :topk-group topk-group :norm norm :scaling scaling)
                    (deepseek-v3-mlp :dim dim :hidden hidden)))
  (defparam input-layernorm (deepseek-v3-rms-norm :dim dim :eps eps))
  (defparam post-attention-layernorm (deepseek-v3-rms-norm :dim dim :eps eps))
  (defun forward (x cos sin)
    (let ((x (+ x (self-attn (input-layernorm x) cos sin))))
      (+ x (mlp (post-attention-layernorm x))))))

(defmodel deepseek-v3-model
    (&key (vocab 129280) (dim 7168) (hidden 18432) (moe-hidden 2048) (depth 61) (heads 128)
          (q-rank 1536) (kv-rank 512) (rope-dim 64) (nope-dim 128) (v-dim 128) (eps 1e-6)
          (theta 10000.0) (first-dense 3) (num-experts 256) (shared 1) (top-k 8) (n-group 8)
          (topk-group 4) (norm-topk true) (scaling 2.5) (pad-token-id none))
  (defparam embed-tokens
    (embedding :num-embeddings vocab :embedding-dim dim :padding-idx pad-token-id))
  (defparam layers
    (stack (i depth)
      (deepseek-v3-decoder-layer :dim dim :hidden hidden :moe-hidden moe-hidden :heads heads
                                 :q-rank q-rank :kv-rank kv-rank :rope-dim rope-dim
                                 :nope-dim nope-dim :v-dim v-dim :eps eps :layer-idx i
                                 :first-dense first-dense :num-experts num-experts
                                 :shared shared :top-k top-k :n-group n-group
                                 :topk-group topk-group :norm norm-topk :scaling scaling)))
  (defparam norm (deepseek-v3-rms-norm :dim dim :eps eps))
  ;; DeepseekV3RotaryEmbedding over the rotary dims: inv_freq computed once, an f32 buffer
  ;; out of state_dict, read in f32; cos and sin of the first half of its table, what the
  ;; interleaved rotary reads, computed in f32 and rounded once to x's dtype
  (defparam inv-freq (/ 1.0 (pow theta (/ (arange 0 rope-dim 2) rope-dim)))
    :numerics :high :trainable false :persistent false)
  (defun forward (input-ids)
    (let ((x (embed-tokens input-ids))
          (freqs (outer (arange-of x :axis 1) inv-freq)))
      (norm (chain layers x (cast-run (cos freqs)) (cast-run (sin freqs)))))))

(defparam model
  (deepseek-v3-model :vocab vocab-size :dim hidden-size :hidden intermediate-size
                     :moe-hidden moe-intermediate-size :depth num-hidden-layers
                     :heads num-attention-heads :q-rank q-lora-rank :kv-rank kv-lora-rank
                     :rope-dim qk-rope-head-dim :nope-dim qk-nope-head-dim :v-dim v-head-dim
                     :eps rms-norm-eps :theta rope-theta :first-dense first-k-dense-replace
                     :num-experts n-routed-experts :shared n-shared-experts
                     :top-k num-experts-per-tok :n-group n-group :topk-group topk-group
                     :norm-topk norm-topk-prob :scaling routed-scaling-factor
                     :pad-token-id pad-token-id))
(defparam lm-head (linear-layer :in-features hidden-size :out-features vocab-size))

(defun forward (input-ids) (lm-head (model input-ids)))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
