;; Hugging Face transformers' BertModel (models/bert/modeling_bert.py, Apache licence 2.0),
;; with its state_dict: a checkpoint loads with strict=True. The constructor takes
;; BertConfig's names; an encoder (no cross-attention, no cache), hidden_act "gelu", SDPA
;; attention with the padding mask, token types, and the pooler. forward gives
;; (last_hidden_state, pooler_output). Dropout is active in training mode, as the real
;; module's nn.Dropout is; the attention probabilities' dropout is not written (see below).

(defconst vocab-size 30522)
(defconst hidden-size 768)
(defconst num-hidden-layers 12)
(defconst num-attention-heads 12)
(defconst intermediate-size 3072)
(defconst hidden-dropout-prob 0.1)
(defconst max-position-embeddings 512)
(defconst type-vocab-size 2)
(defconst layer-norm-eps 1e-12)
(defconst pad-token-id 0)

(defmodel linear-layer (&key (in-features 768) (out-features 768))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defparam bias (zeros [out-features]))
  (defun forward (x) (linear x weight bias)))

(defmodel embedding (&key (num-embeddings 30522) (embedding-dim 768) (padding-idx none))
  (defparam weight (normal [num-embeddings embedding-dim] :std 0.02 :padding-idx padding-idx))
  (defun forward (ids) (take weight ids :padding-idx padding-idx)))

(defmodel bert-embeddings (&key (vocab 30522) (dim 768) (max-positions 512) (types 2)
                                (eps 1e-12) (p 0.1) (pad-token-id 0))
  (defparam word-embeddings
    (embedding :num-embeddings vocab :embedding-dim dim :padding-idx pad-token-id))
  (defparam position-embeddings (embedding :num-embeddings max-positions :embedding-dim dim))
  (defparam token-type-embeddings (embedding :num-embeddings types :embedding-dim dim))
  (defparam LayerNorm (LayerNorm dim :eps eps))
  (defun forward (input-ids token-type-ids)
    (let ((embeddings (+ (word-embeddings input-ids) (token-type-embeddings token-type-ids)))
          (embeddings (+ embeddings (position-embeddings (positions input-ids :axis 1)))))
      (dropout (LayerNorm embeddings) p))))

(defmodel bert-self-attention (&key (dim 768) (heads 12))
  (defparam query (linear-layer :in-features dim :out-features dim))
  (defparam key (linear-layer :in-features dim :out-features dim))
  (defparam value (linear-layer :in-features dim :out-features dim))
  (defun split-heads (x) (transpose (reshape x [0 0 -1 (// dim heads)]) [0 2 1 3]))
  (defun forward (hidden-states mask)
    (let ((y (attention (split-heads (query hidden-states)) (split-heads (key hidden-states))
                        (split-heads (value hidden-states)) mask)))
      (reshape (transpose y [0 2 1 3]) [0 0 -1]))))

(defmodel bert-self-output (&key (dim 768) (eps 1e-12) (p 0.1))
  (defparam dense (linear-layer :in-features dim :out-features dim))
  (defparam LayerNorm (LayerNorm dim :eps eps))
  (defun forward (hidden-states input-tensor)
    (LayerNorm (+ (dropout (dense hidden-states) p) input-tensor))))

(defmodel bert-attention (&key (dim 768) (heads 12) (eps 1e-12) (p 0.1))
  (defparam self (bert-self-attention :dim dim :heads heads))
  (defparam output (bert-self-output :dim dim :eps eps :p p))
  (defun forward (hidden-states mask) (output (self hidden-states mask) hidden-states)))

(defmodel bert-intermediate (&key (dim 768) (hidden 3072))
  (defparam dense (linear-layer :in-features dim :out-features hidden))
  (defun forward (hidden-states) (gelu (dense hidden-states))))

(defmodel bert-output (&key (dim 768) (hidden 3072) (eps 1e-12) (p 0.1))
  (defparam dense (linear-layer :in-features hidden :out-features dim))
  (defparam LayerNorm (LayerNorm dim :eps eps))
  (defun forward (hidden-states input-tensor)
    (LayerNorm (+ (dropout (dense hidden-states) p) input-tensor))))

(defmodel bert-layer (&key (dim 768) (hidden 3072) (heads 12) (eps 1e-12) (p 0.1))
  (defparam attention (bert-attention :dim dim :heads heads :eps eps :p p))
  (defparam intermediate (bert-intermediate :dim dim :hidden hidden))
  (defparam output (bert-output :dim dim :hidden hidden :eps eps :p p))
  (defun forward (hidden-states mask)
    (let ((attention-output (attention hidden-states mask)))
      (output (intermediate attention-output) attention-output))))

(defmodel bert-encoder (&key (depth 12) (dim 768) (hidden 3072) (heads 12) (eps 1e-12)
                             (p 0.1))
  (defparam layer (stack depth (bert-layer :dim dim :hidden hidden :heads heads :eps eps :p p)))
  (defun forward (hidden-states mask) (chain layer hidden-states mask)))

(defmodel bert-pooler (&key (dim 768))
  (defparam dense (linear-layer :in-features dim :out-features dim))
  (defun forward (hidden-states)
    "The first token's state, hidden_states[:, 0], through dense and tanh."
    (tanh (dense (reshape (slice hidden-states :axis 1 :end 1) [0 -1])))))

(defparam embeddings (bert-embeddings :vocab vocab-size :dim hidden-size
                                      :max-positions max-position-embeddings
                                      :types type-vocab-size :eps layer-norm-eps
                                      :p hidden-dropout-prob :pad-token-id pad-token-id))
(defparam encoder (bert-encoder :depth num-hidden-layers :dim hidden-size
                                :hidden intermediate-size :heads num-attention-heads
                                :eps layer-norm-eps :p hidden-dropout-prob))
(defparam pooler (bert-pooler :dim hidden-size))

(defun forward (input-ids token-type-ids attention-mask)
  "(last_hidden_state, pooler_output); attention_mask [B S] is 1 for the tokens to attend to."
  (let ((mask (> (reshape attention-mask [0 1 1 -1]) 0))
        (sequence-output (encoder (embeddings input-ids token-type-ids) mask)))
    [sequence-output (pooler sequence-output)]))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
