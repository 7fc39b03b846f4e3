;; Hugging Face transformers' ViTModel (models/vit/modeling_vit.py, Apache licence 2.0), with
;; its state_dict: a checkpoint loads with strict=True. The constructor takes ViTConfig's
;; names; square images and patches, gelu and a tanh pooler (the config's defaults), SDPA
;; attention, no mask token and no interpolation of the position embeddings.

(defconst hidden-size 768)
(defconst num-hidden-layers 12)
(defconst num-attention-heads 12)
(defconst intermediate-size 3072)
(defconst layer-norm-eps 1e-12)
(defconst image-size 224)
(defconst patch-size 16)
(defconst num-channels 3)
(defconst qkv-bias true)
(defconst pooler-output-size hidden-size)

(defmodel linear-layer (&key (in-features 768) (out-features 768) (with-bias true))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defparam bias (zeros [out-features]) :when with-bias)
  (defun forward (x) (if with-bias (linear x weight bias) (linear x weight))))

(defmodel conv-layer (&key (in-channels 3) (out-channels 768) (kernel-size 16))
  (defparam weight (normal [out-channels in-channels kernel-size kernel-size] :std 0.02))
  (defparam bias (zeros [out-channels]))
  (defun forward (x) (conv2d x weight bias :stride kernel-size)))

;; the patches' features, flattened and moved last: [B, D, H/P, W/P] -> [B, HW/P², D]
(defmodel vit-patch-embeddings (&key (channels 3) (dim 768) (patch 16))
  (defparam projection (conv-layer :in-channels channels :out-channels dim :kernel-size patch))
  (defun forward (pixel-values) (swap-axes (reshape (projection pixel-values) [0 0 -1]) 1 2)))

(defmodel vit-embeddings (&key (channels 3) (dim 768) (patch 16) (image 224))
  (defparam cls-token (normal [1 1 dim] :std 0.02))
  (defparam patch-embeddings (vit-patch-embeddings :channels channels :dim dim :patch patch))
  (defparam position-embeddings (normal [1 (+ (* (// image patch) (// image patch)) 1) dim] :std 0.02))
  (defun forward (pixel-values)
    (let ((patches (patch-embeddings pixel-values))
          (cls (expand-as cls-token (slice patches :axis 1 :end 1))))
      (+ (concat [cls patches] :axis 1) position-embeddings))))

(defmodel vit-attention (&key (dim 768) (heads 12) (bias true))
  (defparam q-proj (linear-layer :in-features dim :out-features dim :with-bias bias))
  (defparam k-proj (linear-layer :in-features dim :out-features dim :with-bias bias))
  (defparam v-proj (linear-layer :in-features dim :out-features dim :with-bias bias))
  (defparam o-proj (linear-layer :in-features dim :out-features dim))
  (defun split-heads (x) (transpose (reshape x [0 0 heads -1]) [0 2 1 3]))
  (defun forward (x)
    (let ((query (split-heads (q-proj x)))
          (key (split-heads (k-proj x)))
          (value (split-heads (v-proj x)))
          (y (attention query key value)))
      (o-proj (reshape (transpose y [0 2 1 3]) [0 0 -1])))))

(defmodel vit-mlp (&key (dim 768) (hidden 3072))
  (defparam fc1 (linear-layer :in-features dim :out-features hidden))
  (defparam fc2 (linear-layer :in-features hidden :out-features dim))
  (defun forward (x) (fc2 (gelu (fc1 x)))))

(defmodel vit-layer (&key (dim 768) (hidden 3072) (heads 12) (bias true) (eps 1e-12))
  (defparam attention (vit-attention :dim dim :heads heads :bias bias))
  (defparam layernorm-before (LayerNorm dim :eps eps))
  (defparam layernorm-after (LayerNorm dim :eps eps))
  (defparam mlp (vit-mlp :dim dim :hidden hidden))
  (defun forward (x)
    (let ((x (+ (attention (layernorm-before x)) x)))
      (+ (mlp (layernorm-after x)) x))))

;; the first token's state through a dense layer and tanh
(defmodel vit-pooler (&key (dim 768) (out 768))
  (defparam dense (linear-layer :in-features dim :out-features out))
  (defun forward (h) (tanh (dense (reshape (slice h :axis 1 :end 1) [0 -1])))))

(defparam embeddings (vit-embeddings :channels num-channels :dim hidden-size :patch patch-size
                                     :image image-size))
(defparam layers (stack num-hidden-layers (vit-layer :dim hidden-size :hidden intermediate-size
                                                     :heads num-attention-heads :bias qkv-bias
                                                     :eps layer-norm-eps)))
(defparam layernorm (LayerNorm hidden-size :eps layer-norm-eps))
(defparam pooler (vit-pooler :dim hidden-size :out pooler-output-size))

;; BaseModelOutputWithPooling's two tensors: (last_hidden_state, pooler_output)
(defun forward (pixel-values)
  (let ((hidden-states (chain layers (embeddings pixel-values)))
        (sequence-output (layernorm hidden-states)))
    [sequence-output (pooler sequence-output)]))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
