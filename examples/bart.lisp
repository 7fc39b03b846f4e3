;; Hugging Face transformers' BartForConditionalGeneration (models/bart/modeling_bart.py, Apache
;; licence 2.0), with its state_dict: a checkpoint loads with strict=True. The constructor
;; takes BartConfig's names; activation_function "gelu", tied embeddings (tie_word_embeddings,
;; BartConfig's default), the eager attention, no padding masks, no dropout (the model in eval
;; mode). A run with `:generate decoder-input-ids` generates with a KV cache.

(defconst vocab-size 50265)
(defconst max-position-embeddings 1024)
(defconst encoder-layers 12)
(defconst encoder-ffn-dim 4096)
(defconst encoder-attention-heads 16)
(defconst decoder-layers 12)
(defconst decoder-ffn-dim 4096)
(defconst decoder-attention-heads 16)
(defconst d-model 1024)
(defconst init-std 0.02)
(defconst scale-embedding false)
(defconst pad-token-id 1)

(defmodel linear-layer (&key in-features out-features ((:bias has-bias) true) (std 0.02))
  (defparam weight (normal [out-features in-features] :std std))
  (defparam bias (zeros [out-features]) :when has-bias)
  (defun forward (x) (if has-bias (linear x weight bias) (linear x weight))))

;; BartScaledWordEmbedding: nn.Embedding's rows times embed_scale
(defmodel bart-scaled-word-embedding (&key num-embeddings embedding-dim (padding-idx none)
                                           (embed-scale 1.0) (std 0.02))
  (defparam weight (normal [num-embeddings embedding-dim] :std std :padding-idx padding-idx))
  (defun forward (input-ids)
    (* (take weight input-ids :padding-idx padding-idx) embed-scale)))

;; BartLearnedPositionalEmbedding: two rows more than the positions, which start at row 2
;; (its offset); when generating, they start where the cache ends
(defmodel bart-learned-positional-embedding (&key num-embeddings embedding-dim (std 0.02))
  (defparam weight (normal [(+ num-embeddings 2) embedding-dim] :std std))
  (defun forward (input-ids) (take weight (+ (positions input-ids :axis 1) 2))))

(defmodel bart-attention (&key embed-dim num-heads (is-causal false) (std 0.02))
  (defparam k-proj (linear-layer embed-dim embed-dim :std std))
  (defparam v-proj (linear-layer embed-dim embed-dim :std std))
  (defparam q-proj (linear-layer embed-dim embed-dim :std std))
  (defparam out-proj (linear-layer embed-dim embed-dim :std std))
  (defun split-heads (x) (transpose (reshape x [0 0 -1 (// embed-dim num-heads)]) [0 2 1 3]))
  ;; eager_attention_forward: the scores times head_dim**-0.5, the causal mask where the
  ;; decoder attends to itself, softmax in the scores' dtype; key-value-states are the
  ;; hidden states themselves but in the decoder's cross-attention
  (defun forward (hidden-states key-value-states)
    (let ((query-states (split-heads (q-proj hidden-states)))
          (key-states (split-heads (k-proj key-value-states)))
          (value-states (split-heads (v-proj key-value-states)))
          (attn-weights (* (matmul query-states (transpose key-states [0 1 3 2]))
                           (** (// embed-dim num-heads) -0.5)))
          (attn-weights (softmax (if is-causal (causal-mask attn-weights) attn-weights)
                                 :axis -1 :dtype :input))
          (attn-output (transpose (matmul attn-weights value-states) [0 2 1 3])))
      (out-proj (reshape attn-output [0 0 -1])))))

;; post-LN: each residual sum through its layer norm
(defmodel bart-encoder-layer (&key d-model heads ffn-dim (std 0.02))
  (defparam self-attn (bart-attention :embed-dim d-model :num-heads heads :std std))
  (defparam self-attn-layer-norm (LayerNorm d-model))
  (defparam fc1 (linear-layer d-model ffn-dim :std std))
  (defparam fc2 (linear-layer ffn-dim d-model :std std))
  (defparam final-layer-norm (LayerNorm d-model))
  (defun forward (hidden-states)
    (let ((hidden-states (self-attn-layer-norm
                          (+ hidden-states (self-attn hidden-states hidden-states)))))
      (final-layer-norm (+ hidden-states (fc2 (gelu (fc1 hidden-states))))))))

(defmodel bart-decoder-layer (&key d-model heads ffn-dim (std 0.02))
  (defparam self-attn
    (bart-attention :embed-dim d-model :num-heads heads :is-causal true :std std))
  (defparam self-attn-layer-norm (LayerNorm d-model))
  (defparam encoder-attn (bart-attention :embed-dim d-model :num-heads heads :std std))
  (defparam encoder-attn-layer-norm (LayerNorm d-model))
  (defparam fc1 (linear-layer d-model ffn-dim :std std))
  (defparam fc2 (linear-layer ffn-dim d-model :std std))
  (defparam final-layer-norm (LayerNorm d-model))
  (defun forward (hidden-states encoder-hidden-states)
    (let ((hidden-states (self-attn-layer-norm
                          (+ hidden-states (self-attn hidden-states hidden-states))))
          (hidden-states (encoder-attn-layer-norm
                          (+ hidden-states (encoder-attn hidden-states encoder-hidden-states)))))
      (final-layer-norm (+ hidden-states (fc2 (gelu (fc1 hidden-states))))))))

(defmodel bart-encoder (&key vocab-size d-model max-positions depth heads ffn-dim
                             (padding-idx none) (embed-scale 1.0) (std 0.02))
  (defparam embed-tokens (bart-scaled-word-embedding vocab-size d-model padding-idx
                                                     :embed-scale embed-scale :std std))
  (defparam embed-positions (bart-learned-positional-embedding max-positions d-model :std std))
  (defparam layers
    (stack depth (bart-encoder-layer :d-model d-model :heads heads :ffn-dim ffn-dim :std std)))
  (defparam layernorm-embedding (LayerNorm d-model))
  (defun forward (input-ids)
    (let ((hidden-states (layernorm-embedding (+ (embed-tokens input-ids)
                                                 (embed-positions input-ids)))))
      (chain layers hidden-states))))

(defmodel bart-decoder (&key vocab-size d-model max-positions depth heads ffn-dim
                             (padding-idx none) (embed-scale 1.0) (std 0.02))
  (defparam embed-tokens (bart-scaled-word-embedding vocab-size d-model padding-idx
                                                     :embed-scale embed-scale :std std))
  (defparam embed-positions (bart-learned-positional-embedding max-positions d-model :std std))
  (defparam layers
    (stack depth (bart-decoder-layer :d-model d-model :heads heads :ffn-dim ffn-dim :std std)))
  (defparam layernorm-embedding (LayerNorm d-model))
  (defun forward (input-ids encoder-hidden-states)
    (let ((hidden-states (layernorm-embedding (+ (embed-tokens input-ids)
                                                 (embed-positions input-ids)))))
      (chain layers hidden-states encoder-hidden-states))))

(defmodel bart-model (&key vocab-size d-model max-positions encoder-layers encoder-heads
                           encoder-ffn-dim decoder-layers decoder-heads decoder-ffn-dim
                           (padding-idx none) (embed-scale 1.0) (std 0.02))
  (defparam shared (bart-scaled-word-embedding vocab-size d-model padding-idx
                                               :embed-scale embed-scale :std std))
  (defparam encoder (bart-encoder :vocab-size vocab-size :d-model d-model
                                  :max-positions max-positions :depth encoder-layers
                                  :heads encoder-heads :ffn-dim encoder-ffn-dim
                                  :padding-idx padding-idx :embed-scale embed-scale
                                  :std std))
  (defparam decoder (bart-decoder :vocab-size vocab-size :d-model d-model
                                  :max-positions max-positions :depth decoder-layers
                                  :heads decoder-heads :ffn-dim decoder-ffn-dim
                                  :padding-idx padding-idx :embed-scale embed-scale
                                  :std std))
  (defun forward (input-ids decoder-input-ids)
    (decoder decoder-input-ids (encoder input-ids))))

(defparam model (bart-model :vocab-size vocab-size :d-model d-model
                            :max-positions max-position-embeddings
                            :encoder-layers encoder-layers
                            :encoder-heads encoder-attention-heads
                            :encoder-ffn-dim encoder-ffn-dim :decoder-layers decoder-layers
                            :decoder-heads decoder-attention-heads
                            :decoder-ffn-dim decoder-ffn-dim :padding-idx pad-token-id
                            :embed-scale (if scale-embedding (sqrt d-model) 1.0)
                            :std init-std))
(defparam final-logits-bias (zeros [1 vocab-size]) :trainable false)
(defparam lm-head (linear-layer d-model vocab-size :bias false :std init-std))
(tie model.encoder.embed-tokens.weight model.shared.weight)
(tie model.decoder.embed-tokens.weight model.shared.weight)
(tie lm-head.weight model.shared.weight)

(defun forward (input-ids decoder-input-ids)
  (+ (lm-head (model input-ids decoder-input-ids)) final-logits-bias))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
(defrun generate :precision :bf16 :generate decoder-input-ids)
