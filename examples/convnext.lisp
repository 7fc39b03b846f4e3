;; Hugging Face transformers' ConvNextModel (models/convnext/modeling_convnext.py, Apache
;; licence 2.0), with its state_dict: a checkpoint loads with strict=True. The constructor
;; takes ConvNextConfig's names, its lists as lists (ConvNext(depths=[3, 3, 27, 3])); gelu
;; (the config's default) and no drop path (transformers' at inference).

(defconst num-channels 3)
(defconst patch-size 4)
(defconst num-stages 4)
(defconst hidden-sizes [96 192 384 768])
(defconst depths [3 3 9 3])
(defconst layer-norm-eps 1e-12)
(defconst layer-scale-init-value 1e-6)
(defconst initializer-range 0.02)

;; torch's nn.Linear, nn.Conv2d and nn.LayerNorm, with their keys
(defmodel linear-layer (&key (in-features 96) (out-features 96) (std 0.02))
  (defparam weight (normal [out-features in-features] :std std))
  (defparam bias (zeros [out-features]))
  (defun forward (x) (linear x weight bias)))

(defmodel conv-layer (&key (in-channels 3) (out-channels 96) (kernel-size 4) (stride 1)
                           (padding 0) (groups 1) (std 0.02))
  (defparam weight (normal [out-channels (// in-channels groups) kernel-size kernel-size] :std std))
  (defparam bias (zeros [out-channels]))
  (defun forward (x) (conv2d x weight bias :stride stride :padding padding :groups groups)))

;; ConvNextLayerNorm: nn.LayerNorm over the last axis; channels first, the channels moved
;; last and back
(defmodel layer-norm (&key (dim 96) (eps 1e-6) (channels-first false))
  (defparam weight (ones [dim]))
  (defparam bias (zeros [dim]))
  (defun forward (x)
    (if channels-first
        (transpose (fused-layer-norm (transpose x [0 2 3 1]) weight bias :eps eps) [0 3 1 2])
        (fused-layer-norm x weight bias :eps eps))))

(defmodel convnext-embeddings (&key (channels 3) (dim 96) (patch 4) (std 0.02))
  (defparam patch-embeddings
    (conv-layer :in-channels channels :out-channels dim :kernel-size patch :stride patch :std std))
  (defparam layernorm (layer-norm :dim dim :channels-first true))
  (defun forward (pixel-values) (layernorm (patch-embeddings pixel-values))))

(defmodel convnext-layer (&key (dim 96) (scale 1e-6) (std 0.02))
  (defparam dwconv
    (conv-layer :in-channels dim :out-channels dim :kernel-size 7 :padding 3 :groups dim :std std))
  (defparam layernorm (layer-norm :dim dim))
  (defparam pwconv1 (linear-layer :in-features dim :out-features (* 4 dim) :std std))
  (defparam pwconv2 (linear-layer :in-features (* 4 dim) :out-features dim :std std))
  (defparam layer-scale-parameter (full [dim] scale) :when (> scale 0))
  (defun forward (features)
    (let ((h (pwconv2 (gelu (pwconv1 (layernorm (transpose (dwconv features) [0 2 3 1])))))))
      (+ features (transpose (if (> scale 0) (* layer-scale-parameter h) h) [0 3 1 2])))))

(defmodel convnext-stage (&key (in-channels 96) (out-channels 96) (stride 2) (depth 2)
                               (scale 1e-6) (std 0.02))
  (defparam downsampling-layer
    (sequential (layer-norm :dim in-channels :channels-first true)
                (conv-layer :in-channels in-channels :out-channels out-channels :kernel-size 2
                            :stride stride :std std))
    :when (or (not (= in-channels out-channels)) (> stride 1)))
  (defparam layers (stack depth (convnext-layer :dim out-channels :scale scale :std std)))
  (defun forward (features)
    (chain layers
           (if (or (not (= in-channels out-channels)) (> stride 1))
               (downsampling-layer features)
               features))))

(defmodel convnext-encoder (&key (hidden-sizes [96 192 384 768]) (depths [3 3 9 3])
                                 (num-stages 4) (scale 1e-6) (std 0.02))
  (defparam stages
    (stack (i num-stages)
      (convnext-stage :in-channels (at hidden-sizes (if (= i 0) 0 (- i 1)))
                      :out-channels (at hidden-sizes i) :stride (if (> i 0) 2 1)
                      :depth (at depths i) :scale scale :std std)))
  (defun forward (hidden-states) (chain stages hidden-states)))

(defparam embeddings (convnext-embeddings :channels num-channels :dim (at hidden-sizes 0)
                                          :patch patch-size :std initializer-range))
(defparam encoder (convnext-encoder :hidden-sizes hidden-sizes :depths depths
                                    :num-stages num-stages :scale layer-scale-init-value
                                    :std initializer-range))
(defparam layernorm (layer-norm :dim (at hidden-sizes -1) :eps layer-norm-eps))

;; BaseModelOutputWithPoolingAndNoAttention's two tensors: (last_hidden_state, pooler_output)
(defun forward (pixel-values)
  (let ((last-hidden-state (encoder (embeddings pixel-values))))
    [last-hidden-state (layernorm (mean last-hidden-state :axes [-2 -1]))]))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
