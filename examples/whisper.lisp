;; Hugging Face transformers' WhisperForConditionalGeneration (models/whisper/
;; modeling_whisper.py, Apache licence 2.0), with its state_dict: a checkpoint loads with
;; strict=True. The constructor takes WhisperConfig's names; gelu (the config's default), the
;; eager attention, no masks, no dropout (the model in eval mode). A run with `:generate
;; decoder-input-ids` generates with a KV cache, the encoder run once per prompt.

(defconst vocab-size 51865)
(defconst num-mel-bins 80)
(defconst encoder-layers 4)
(defconst encoder-attention-heads 6)
(defconst decoder-layers 4)
(defconst decoder-attention-heads 6)
(defconst decoder-ffn-dim 1536)
(defconst encoder-ffn-dim 1536)
(defconst d-model 384)
(defconst max-source-positions 1500)
(defconst max-target-positions 448)
(defconst pad-token-id 50256)

;; the sines and cosines of each position times log-spaced frequencies, side by side
(defmodel sinusoidal-embedding (&key (length 1500) (channels 384))
  "The encoder's nn.Embedding of positions, frozen: transformers' sinusoids()"
  (defparam weight
    (concat [(sin (outer (arange 0 length)
                         (exp (* (arange 0 (// channels 2))
                                 (- 0.0 (/ (log 10000) (- (// channels 2) 1)))))))
             (cos (outer (arange 0 length)
                         (exp (* (arange 0 (// channels 2))
                                 (- 0.0 (/ (log 10000) (- (// channels 2) 1)))))))]
            :axis 1)
    :trainable false)
  (defun forward (ids) (take weight ids)))

(defmodel whisper-attention (&key (embed-dim 384) (num-heads 6) (is-causal false))
  (defparam k-proj (Linear embed-dim embed-dim :bias false))
  (defparam v-proj (Linear embed-dim embed-dim))
  (defparam q-proj (Linear embed-dim embed-dim))
  (defparam out-proj (Linear embed-dim embed-dim))
  ;; contiguous, as transformers makes them: the f32 products' bits depend on the layout
  (defun split-heads (x)
    (contiguous (transpose (reshape x [0 0 -1 (// embed-dim num-heads)]) [0 2 1 3])))
  ;; the queries scaled by head_dim**-0.5 before the product, as Whisper orders it
  ;; (eager_attention_forward's scaling 1.0 multiplies by nothing); the causal mask where the
  ;; decoder attends to itself, softmax in the scores' dtype
  (defun forward (hidden-states key-value-states)
    (let ((query-states (split-heads (* (q-proj hidden-states)
                                        (** (// embed-dim num-heads) -0.5))))
          (key-states (split-heads (k-proj key-value-states)))
          (value-states (split-heads (v-proj key-value-states)))
          (attn-weights (matmul query-states (transpose key-states [0 1 3 2])))
          (attn-weights (softmax (if is-causal (causal-mask attn-weights) attn-weights)
                                 :axis -1 :dtype :input))
          (attn-output (transpose (matmul attn-weights value-states) [0 2 1 3])))
      (out-proj (reshape attn-output [0 0 -1])))))

(defmodel whisper-encoder-layer (&key (embed-dim 384) (num-heads 6) (ffn-dim 1536))
  (defparam self-attn (whisper-attention :embed-dim embed-dim :num-heads num-heads))
  (defparam self-attn-layer-norm (LayerNorm embed-dim))
  (defparam fc1 (Linear embed-dim ffn-dim))
  (defparam fc2 (Linear ffn-dim embed-dim))
  (defparam final-layer-norm (LayerNorm embed-dim))
  (defun forward (hidden-states)
    (let ((normed (self-attn-layer-norm hidden-states))
          (hidden-states (+ hidden-states (self-attn normed normed))))
      (+ hidden-states (fc2 (gelu (fc1 (final-layer-norm hidden-states))))))))

(defmodel whisper-decoder-layer (&key (embed-dim 384) (num-heads 6) (ffn-dim 1536))
  (defparam self-attn (whisper-attention :embed-dim embed-dim :num-heads num-heads
                                         :is-causal true))
  (defparam self-attn-layer-norm (LayerNorm embed-dim))
  (defparam encoder-attn (whisper-attention :embed-dim embed-dim :num-heads num-heads))
  (defparam encoder-attn-layer-norm (LayerNorm embed-dim))
  (defparam fc1 (Linear embed-dim ffn-dim))
  (defparam fc2 (Linear ffn-dim embed-dim))
  (defparam final-layer-norm (LayerNorm embed-dim))
  (defun forward (hidden-states encoder-hidden-states)
    (let ((normed (self-attn-layer-norm hidden-states))
          (hidden-states (+ hidden-states (self-attn normed normed)))
          (normed (encoder-attn-layer-norm hidden-states))
          (hidden-states (+ hidden-states (encoder-attn normed encoder-hidden-states))))
      (+ hidden-states (fc2 (gelu (fc1 (final-layer-norm hidden-states))))))))

(defmodel whisper-encoder (&key (num-mel-bins 80) (d-model 384) (encoder-layers 4) (heads 6)
                                (ffn-dim 1536) (max-source-positions 1500))
  (defparam conv1 (Conv1d num-mel-bins d-model 3 :padding 1))
  (defparam conv2 (Conv1d d-model d-model 3 :stride 2 :padding 1))
  (defparam embed-positions
    (sinusoidal-embedding :length max-source-positions :channels d-model))
  (defparam layers (stack encoder-layers (whisper-encoder-layer :embed-dim d-model :num-heads heads
                                                        :ffn-dim ffn-dim)))
  (defparam layer-norm (LayerNorm d-model))
  ;; every position's row: the mel frames are 2 * max_source_positions long
  (defun forward (input-features)
    (let ((inputs-embeds (transpose (gelu (conv2 (gelu (conv1 input-features)))) [0 2 1]))
          (hidden-states (+ inputs-embeds (embed-positions (positions inputs-embeds :axis 1)))))
      (layer-norm (chain layers hidden-states)))))

(defmodel whisper-decoder (&key (vocab-size 51865) (d-model 384) (decoder-layers 4) (heads 6)
                                (ffn-dim 1536) (max-target-positions 448) (padding-idx none))
  (defparam embed-tokens (Embedding vocab-size d-model padding-idx))
  (defparam embed-positions (Embedding max-target-positions d-model))
  (defparam layers (stack decoder-layers (whisper-decoder-layer :embed-dim d-model :num-heads heads
                                                        :ffn-dim ffn-dim)))
  (defparam layer-norm (LayerNorm d-model))
  (defun forward (input-ids encoder-hidden-states)
    (let ((hidden-states (+ (embed-tokens input-ids)
                            (embed-positions (positions input-ids :axis 1)))))
      (layer-norm (chain layers hidden-states encoder-hidden-states)))))

(defmodel whisper-model (&key (vocab-size 51865) (num-mel-bins 80) (d-model 384)
                              (encoder-layers 4) (encoder-attention-heads 6)
                              (encoder-ffn-dim 1536) (decoder-layers 4) (pad-token-id 50256)
                              (decoder-attention-heads 6) (decoder-ffn-dim 1536)
                              (max-source-positions 1500) (max-target-positions 448))
  (defparam encoder (whisper-encoder :num-mel-bins num-mel-bins :d-model d-model
                                     :encoder-layers encoder-layers :heads encoder-attention-heads
                                     :ffn-dim encoder-ffn-dim
                                     :max-source-positions max-source-positions))
  (defparam decoder (whisper-decoder :vocab-size vocab-size :d-model d-model
                                     :decoder-layers decoder-layers :heads decoder-attention-heads
                                     :ffn-dim decoder-ffn-dim :padding-idx pad-token-id
                                     :max-target-positions max-target-positions))
  (defun forward (input-features decoder-input-ids)
    (decoder decoder-input-ids (encoder input-features))))

(defparam model (whisper-model :vocab-size vocab-size :num-mel-bins num-mel-bins
                               :d-model d-model :encoder-layers encoder-layers
                               :encoder-attention-heads encoder-attention-heads
                               :encoder-ffn-dim encoder-ffn-dim :decoder-layers decoder-layers
                               :decoder-attention-heads decoder-attention-heads
                               :decoder-ffn-dim decoder-ffn-dim :pad-token-id pad-token-id
                               :max-source-positions max-source-positions
                               :max-target-positions max-target-positions))
(defparam proj-out (Linear d-model vocab-size :bias false))
(tie proj-out.weight model.decoder.embed-tokens.weight)

(defun forward (input-features decoder-input-ids)
  (proj-out (model input-features decoder-input-ids)))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
(defrun generate :precision :bf16 :generate decoder-input-ids)
