;; Hugging Face transformers' T5ForConditionalGeneration (models/t5/modeling_t5.py, Apache
;; licence 2.0) with feed_forward_proj="gated-gelu" (T5 v1.1), with its state_dict: a
;; checkpoint loads with strict=True. The constructor takes T5Config's names; the eager
;; attention, no padding masks, no dropout (the model in eval mode). A run with
;; `:generate decoder-input-ids` generates with a KV cache.

(defconst vocab-size 32128)
(defconst d-model 512)
(defconst d-kv 64)
(defconst d-ff 2048)
(defconst num-layers 6)
(defconst num-decoder-layers num-layers "T5Config's None: num_layers")
(defconst num-heads 8)
(defconst relative-attention-num-buckets 32)
(defconst relative-attention-max-distance 128)
(defconst layer-norm-epsilon 1e-6)
(defconst tie-word-embeddings true "T5Config's scale_decoder_outputs: false for T5 v1.1")

(defmodel linear-layer (&key (in-features 512) (out-features 512))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defun forward (x) (linear x weight)))

(defmodel embedding (&key (num-embeddings 32128) (embedding-dim 512))
  (defparam weight (normal [num-embeddings embedding-dim] :std 1.0))
  (defun forward (ids) (take weight ids)))

;; T5LayerNorm: the variance in f32, x times its rsqrt in f32, rounded to the weight's dtype
(defmodel t5-layer-norm (&key (hidden-size 512) (eps 1e-6))
  (defparam weight (ones [hidden-size]))
  (defun forward (hidden-states)
    (* weight (with-numerics (:sensitivity :high)
                (* hidden-states
                   (rsqrt (+ (mean (pow hidden-states 2) :axes [-1] :keepdims true) eps)))))))

;; NewGELUActivation (ACT2FN["gelu_new"]) as it is written, rounding after each op in bf16
(defun gelu-new (x)
  (* 0.5 x (+ 1.0 (tanh (* (sqrt (/ 2.0 3.141592653589793))
                           (+ x (* 0.044715 (pow x 3.0))))))))

;; wo reads the product in its own dtype, the run's: _keep_in_fp32_modules keeps it f32 only
;; for float16 checkpoints
(defmodel t5-dense-gated-act-dense (&key (d-model 512) (d-ff 2048))
  (defparam wi-0 (linear-layer :in-features d-model :out-features d-ff))
  (defparam wi-1 (linear-layer :in-features d-model :out-features d-ff))
  (defparam wo (linear-layer :in-features d-ff :out-features d-model))
  (defun forward (hidden-states)
    (wo (* (gelu-new (wi-0 hidden-states)) (wi-1 hidden-states)))))

(defmodel t5-layer-ff (&key (d-model 512) (d-ff 2048) (eps 1e-6))
  (defparam DenseReluDense (t5-dense-gated-act-dense :d-model d-model :d-ff d-ff))
  (defparam layer-norm (t5-layer-norm :hidden-size d-model :eps eps))
  (defun forward (hidden-states)
    (+ hidden-states (DenseReluDense (layer-norm hidden-states)))))

(defmodel t5-attention (&key (d-model 512) (d-kv 64) (n-heads 8) (is-decoder false)
                             (has-relative-attention-bias false) (num-buckets 32)
                             (max-distance 128) (cross-attention false))
  (defparam q (linear-layer :in-features d-model :out-features (* n-heads d-kv)))
  (defparam k (linear-layer :in-features d-model :out-features (* n-heads d-kv)))
  (defparam v (linear-layer :in-features d-model :out-features (* n-heads d-kv)))
  (defparam o (linear-layer :in-features (* n-heads d-kv) :out-features d-model))
  (defparam relative-attention-bias (embedding :num-embeddings num-buckets :embedding-dim n-heads)
    :when has-relative-attention-bias)
  ;; _relative_position_bucket: half the buckets for exact distances, half log-spaced up to
  ;; max-distance, both signs apart where bidirectional
  (defun relative-position-bucket (relative-position &key (bidirectional true))
    (let ((buckets (if bidirectional (// num-buckets 2) num-buckets))
          (relative-buckets (if bidirectional
                                (* (cast (> relative-position 0) :i64) buckets)
                                0))
          (relative-position (if bidirectional
                                 (abs relative-position)
                                 (- (minimum relative-position 0))))
          (max-exact (// buckets 2))
          (is-small (< relative-position max-exact))
          (relative-position-if-large
           (+ max-exact (cast (* (/ (log (/ (cast relative-position :f32) max-exact))
                                    (log (/ max-distance max-exact)))
                                 (- buckets max-exact))
                              :i64)))
          (relative-position-if-large (minimum relative-position-if-large (- buckets 1))))
      (+ relative-buckets (where is-small relative-position relative-position-if-large))))
  ;; compute_bias: [1, heads, query length, key length], the lengths the scores'
  (defun compute-bias (scores)
    (let ((context-position (unsqueeze (positions scores :axis 2) :axis 1))
          (memory-position (unsqueeze (positions scores :axis 3) :axis 0))
          (bucket (relative-position-bucket (- memory-position context-position)
                                            :bidirectional (not is-decoder))))
      (unsqueeze (transpose (relative-attention-bias bucket) [2 0 1]) :axis 0)))
  (defun split-heads (x) (transpose (reshape x [0 0 -1 d-kv]) [0 2 1 3]))
  ;; eager_attention_forward with T5's scaling of 1.0: scores plus the position bias (zeros
  ;; [1, heads, query length, key length] for the cross-attention, which has none), the
  ;; causal mask where the decoder attends to itself, softmax in the scores' dtype
  (defun forward (hidden-states key-value-states position-bias &key (is-causal false))
    (let ((query-states (split-heads (q hidden-states)))
          (key-states (split-heads (k key-value-states)))
          (value-states (split-heads (v key-value-states)))
          (scores (matmul query-states (transpose key-states [0 1 3 2])))
          (position-bias (if has-relative-attention-bias
                             (compute-bias scores)
                             (if cross-attention
                                 (zeros-like (slice scores :axis 0 :end 1))
                                 position-bias)))
          (attn-weights (+ scores position-bias))
          (attn-weights (softmax (if is-causal (causal-mask attn-weights) attn-weights)
                                 :axis -1 :dtype :input))
          (attn-output (transpose (matmul attn-weights value-states) [0 2 1 3])))
      [(o (reshape attn-output [0 0 -1])) position-bias])))

(defmodel t5-layer-self-attention (&key (d-model 512) (d-kv 64) (n-heads 8) (eps 1e-6)
                                        (is-decoder false) (has-relative-attention-bias false)
                                        (num-buckets 32) (max-distance 128))
  (defparam SelfAttention
    (t5-attention :d-model d-model :d-kv d-kv :n-heads n-heads :is-decoder is-decoder
                  :has-relative-attention-bias has-relative-attention-bias
                  :num-buckets num-buckets :max-distance max-distance))
  (defparam layer-norm (t5-layer-norm :hidden-size d-model :eps eps))
  (defun forward (hidden-states position-bias)
    (let ((normed-hidden-states (layer-norm hidden-states))
          ([attention-output position-bias]
           (SelfAttention normed-hidden-states normed-hidden-states position-bias
                          :is-causal is-decoder)))
      [(+ hidden-states attention-output) position-bias])))

(defmodel t5-layer-cross-attention (&key (d-model 512) (d-kv 64) (n-heads 8) (eps 1e-6))
  (defparam EncDecAttention (t5-attention :d-model d-model :d-kv d-kv :n-heads n-heads
                                          :is-decoder true :cross-attention true))
  (defparam layer-norm (t5-layer-norm :hidden-size d-model :eps eps))
  (defun forward (hidden-states key-value-states position-bias)
    (let ((normed-hidden-states (layer-norm hidden-states))
          ([attention-output position-bias]
           (EncDecAttention normed-hidden-states key-value-states position-bias)))
      [(+ hidden-states attention-output) position-bias])))

(defmodel t5-encoder-block (&key (d-model 512) (d-kv 64) (d-ff 2048) (n-heads 8) (eps 1e-6)
                                 (has-relative-attention-bias false) (num-buckets 32)
                                 (max-distance 128))
  (defparam layer
    (module-list
     (t5-layer-self-attention :d-model d-model :d-kv d-kv :n-heads n-heads :eps eps
                              :has-relative-attention-bias has-relative-attention-bias
                              :num-buckets num-buckets :max-distance max-distance)
     (t5-layer-ff :d-model d-model :d-ff d-ff :eps eps)))
  (defun forward (hidden-states position-bias)
    (let (([hidden-states position-bias] (nth layer 0 hidden-states position-bias)))
      [(nth layer 1 hidden-states) position-bias])))

(defmodel t5-decoder-block (&key (d-model 512) (d-kv 64) (d-ff 2048) (n-heads 8) (eps 1e-6)
                                 (has-relative-attention-bias false) (num-buckets 32)
                                 (max-distance 128))
  (defparam layer
    (module-list
     (t5-layer-self-attention :d-model d-model :d-kv d-kv :n-heads n-heads :eps eps
                              :is-decoder true
                              :has-relative-attention-bias has-relative-attention-bias
                              :num-buckets num-buckets :max-distance max-distance)
     (t5-layer-cross-attention :d-model d-model :d-kv d-kv :n-heads n-heads :eps eps)
     (t5-layer-ff :d-model d-model :d-ff d-ff :eps eps)))
  (defun forward (hidden-states position-bias encoder-hidden-states
                  encoder-decoder-position-bias)
    (let (([hidden-states self-attn-position-bias] (nth layer 0 hidden-states position-bias))
          ([hidden-states cross-attn-position-bias]
           (nth layer 1 hidden-states encoder-hidden-states encoder-decoder-position-bias)))
      [(nth layer 2 hidden-states) self-attn-position-bias cross-attn-position-bias])))

(defmodel t5-encoder (&key (vocab 32128) (d-model 512) (d-kv 64) (d-ff 2048) (depth 6)
                           (n-heads 8) (eps 1e-6) (num-buckets 32) (max-distance 128))
  (defparam embed-tokens (embedding :num-embeddings vocab :embedding-dim d-model))
  (defparam block
    (stack (i depth)
      (t5-encoder-block :d-model d-model :d-kv d-kv :d-ff d-ff :n-heads n-heads :eps eps
                        :has-relative-attention-bias (= i 0) :num-buckets num-buckets
                        :max-distance max-distance)))
  (defparam final-layer-norm (t5-layer-norm :hidden-size d-model :eps eps))
  ;; the position bias starts as None: the first block computes it, the others read it
  (defun forward (input-ids)
    (let ((inputs-embeds (embed-tokens input-ids))
          ([hidden-states _]
           (for (layer-module block) ((hidden-states inputs-embeds)
                                      (position-bias none))
             (let (([hidden-states position-bias] (layer-module hidden-states position-bias)))
               [hidden-states position-bias]))))
      (final-layer-norm hidden-states))))

(defmodel t5-decoder (&key (vocab 32128) (d-model 512) (d-kv 64) (d-ff 2048) (depth 6)
                           (n-heads 8) (eps 1e-6) (num-buckets 32) (max-distance 128))
  (defparam embed-tokens (embedding :num-embeddings vocab :embedding-dim d-model))
  (defparam block
    (stack (i depth)
      (t5-decoder-block :d-model d-model :d-kv d-kv :d-ff d-ff :n-heads n-heads :eps eps
                        :has-relative-attention-bias (= i 0) :num-buckets num-buckets
                        :max-distance max-distance)))
  (defparam final-layer-norm (t5-layer-norm :hidden-size d-model :eps eps))
  (defun forward (input-ids encoder-hidden-states)
    (let ((inputs-embeds (embed-tokens input-ids))
          ([hidden-states _ _]
           (for (layer-module block) ((hidden-states inputs-embeds)
                                      (position-bias none)
                                      (encoder-decoder-position-bias none))
             (let (([hidden-states self-attention-position-bias cross-attention-position-bias]
                    (layer-module hidden-states position-bias encoder-hidden-states
                                  encoder-decoder-position-bias)))
               [hidden-states self-attention-position-bias cross-attention-position-bias]))))
      (final-layer-norm hidden-states))))

(defparam shared (embedding :num-embeddings vocab-size :embedding-dim d-model))
(defparam encoder (t5-encoder :vocab vocab-size :d-model d-model :d-kv d-kv :d-ff d-ff
                              :depth num-layers :n-heads num-heads :eps layer-norm-epsilon
                              :num-buckets relative-attention-num-buckets
                              :max-distance relative-attention-max-distance))
(defparam decoder (t5-decoder :vocab vocab-size :d-model d-model :d-kv d-kv :d-ff d-ff
                              :depth num-decoder-layers :n-heads num-heads
                              :eps layer-norm-epsilon
                              :num-buckets relative-attention-num-buckets
                              :max-distance relative-attention-max-distance))
(defparam lm-head (linear-layer :in-features d-model :out-features vocab-size))
(tie encoder.embed-tokens.weight shared.weight)
(tie decoder.embed-tokens.weight shared.weight)
(tie lm-head.weight shared.weight)

(defun forward (input-ids decoder-input-ids)
  (let ((sequence-output (decoder decoder-input-ids (encoder input-ids))))
    (lm-head (if tie-word-embeddings (* sequence-output (** d-model -0.5)) sequence-output))))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
