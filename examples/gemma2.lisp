;; Hugging Face transformers' Gemma2ForCausalLM (models/gemma2/modeling_gemma2.py, Apache
;; licence 2.0), with its state_dict: a checkpoint loads with strict=True. The constructor
;; takes Gemma2Config's names; eager attention with its logit soft-cap, even layers sliding,
;; the embedding scale rounded to the table's dtype, (1 + weight) norms, the final soft-cap;
;; the default rope, no biases, no KV cache, no padding mask, no dropout (eval mode).

(defconst vocab-size 256000)
(defconst hidden-size 2304)
(defconst intermediate-size 9216)
(defconst num-hidden-layers 26)
(defconst num-attention-heads 8)
(defconst num-key-value-heads 4)
(defconst head-dim 256)
(defconst max-position-embeddings 8192 "unused: the rotary table is built for any length")
(defconst rms-norm-eps 1e-6)
(defconst rope-theta 10000.0)
(defconst query-pre-attn-scalar 256)
(defconst sliding-window 4096)
(defconst final-logit-softcapping 30.0)
(defconst attn-logit-softcapping 50.0)
(defconst pad-token-id 0)

(defmodel linear-layer (&key (in-features 2304) (out-features 2304))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defun forward (x) (linear x weight)))

(defmodel embedding (&key (num-embeddings 256000) (embedding-dim 2304) (padding-idx none))
  (defparam weight (normal [num-embeddings embedding-dim] :std 0.02 :padding-idx padding-idx))
  ;; Gemma2TextScaledWordEmbedding: times sqrt(hidden) rounded to the table's dtype
  (defun forward (ids)
    (let ((x (take weight ids :padding-idx padding-idx))) (* x (scalar-like x (sqrt embedding-dim))))))

(defmodel gemma2-rms-norm (&key (dim 2304) (eps 1e-6))
  (defparam weight (zeros [dim]))
  ;; f32 statistics and (1 + weight) product, one rounding back to x's dtype (type_as)
  (defun forward (x)
    (cast-run (with-numerics (:sensitivity :high)
                (* x (rsqrt (+ (mean (square x) :axes [-1] :keepdims true) eps))
                   (+ 1.0 weight))))))

(defmodel gemma2-mlp (&key (dim 2304) (hidden 9216))
  (defparam gate-proj (linear-layer :in-features dim :out-features hidden))
  (defparam up-proj (linear-layer :in-features dim :out-features hidden))
  (defparam down-proj (linear-layer :in-features hidden :out-features dim))
  (defun forward (x) (down-proj (* (gelu (gate-proj x) :approximate :tanh) (up-proj x)))))

(defmodel gemma2-attention (&key (dim 2304) (heads 8) (kv-heads 4) (head-dim 256)
                                 (scalar 256) (softcap 50.0) (window 0))
  (defparam q-proj (linear-layer :in-features dim :out-features (* heads head-dim)))
  (defparam k-proj (linear-layer :in-features dim :out-features (* kv-heads head-dim)))
  (defparam v-proj (linear-layer :in-features dim :out-features (* kv-heads head-dim)))
  (defparam o-proj (linear-layer :in-features (* heads head-dim) :out-features dim))
  (defun rotate-half (x &key (half (// head-dim 2)))
    (concat [(- (slice x :axis -1 :start half)) (slice x :axis -1 :end half)] :axis -1))
  (defun apply-rotary-pos-emb (x cos sin) (+ (* x cos) (* (rotate-half x) sin)))
  (defun split-heads (x) (transpose (reshape x [0 0 -1 head-dim]) [0 2 1 3]))
  ;; transformers' eager attention with its soft-capped scores; an even layer's query sees
  ;; the keys of the window before it (kv_idx > q_idx - sliding_window: :window W keeps
  ;; q_idx - W <= kv_idx)
  (defun forward (x cos sin)
    (let ((q (apply-rotary-pos-emb (split-heads (q-proj x)) cos sin))
          (k (apply-rotary-pos-emb (split-heads (k-proj x)) cos sin))
          (v (split-heads (v-proj x)))
          (y (if (> window 0)
                 (attention q k v :causal true :window (- window 1) :softcap softcap
                            :scale (** scalar -0.5) :enable-gqa true)
                 (attention q k v :causal true :softcap softcap :scale (** scalar -0.5)
                            :enable-gqa true))))
      (o-proj (reshape (transpose y [0 2 1 3]) [0 0 -1])))))

(defmodel gemma2-decoder-layer
    (&key (dim 2304) (hidden 9216) (heads 8) (kv-heads 4) (head-dim 256) (eps 1e-6)
          (scalar 256) (softcap 50.0) (window 0))
  (defparam self-attn (gemma2-attention :dim dim :heads heads :kv-heads kv-heads
                                        :head-dim head-dim :scalar scalar
                                        :softcap softcap :window window))
  (defparam mlp (gemma2-mlp :dim dim :hidden hidden))
  (defparam input-layernorm (gemma2-rms-norm :dim dim :eps eps))
  (defparam post-attention-layernorm (gemma2-rms-norm :dim dim :eps eps))
  (defparam pre-feedforward-layernorm (gemma2-rms-norm :dim dim :eps eps))
  (defparam post-feedforward-layernorm (gemma2-rms-norm :dim dim :eps eps))
  (defun forward (x cos sin)
    (let ((x (+ x (post-attention-layernorm (self-attn (input-layernorm x) cos sin)))))
      (+ x (post-feedforward-layernorm (mlp (pre-feedforward-layernorm x)))))))

(defmodel gemma2-model
    (&key (vocab 256000) (dim 2304) (hidden 9216) (depth 26) (heads 8) (kv-heads 4)
          (head-dim 256) (eps 1e-6) (theta 10000.0) (scalar 256) (softcap 50.0)
          (window 4096) (pad-token-id 0))
  (defparam embed-tokens
    (embedding :num-embeddings vocab :embedding-dim dim :padding-idx pad-token-id))
  ;; layer_types: even layers slide, odd ones attend to every earlier position
  (defparam layers
    (stack (i depth)
           (gemma2-decoder-layer :dim dim :hidden hidden :heads heads :kv-heads kv-heads
                                 :head-dim head-dim :eps eps :scalar scalar :softcap softcap
                                 :window (if (= (mod i 2) 0) window 0))))
  (defparam norm (gemma2-rms-norm :dim dim :eps eps))
  ;; Gemma2RotaryEmbedding: cos and sin computed in f32, rounded once to x's dtype
  (defun forward (input-ids)
    (let ((x (embed-tokens input-ids))
          (inv-freq (/ 1.0 (pow theta (/ (arange x 0 head-dim 2) head-dim))))
          (freqs (outer (arange-of x :axis 1) inv-freq))
          (emb (concat [freqs freqs] :axis -1)))
      (norm (chain layers x (cast-run (cos emb)) (cast-run (sin emb)))))))

(defparam model (gemma2-model :vocab vocab-size :dim hidden-size :hidden intermediate-size
                              :depth num-hidden-layers :heads num-attention-heads
                              :kv-heads num-key-value-heads :head-dim head-dim
                              :eps rms-norm-eps :theta rope-theta
                              :scalar query-pre-attn-scalar :softcap attn-logit-softcapping
                              :window sliding-window :pad-token-id pad-token-id))
(defparam lm-head (linear-layer :in-features hidden-size :out-features vocab-size))
(tie lm-head.weight model.embed-tokens.weight)

(defun forward (input-ids)
  (let ((logits (lm-head (model input-ids))))
    (* (tanh (/ logits final-logit-softcapping)) final-logit-softcapping)))

(defun loss (input-ids targets)
  (cross-entropy (reshape (forward input-ids) [-1 vocab-size]) (reshape targets [-1])))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
