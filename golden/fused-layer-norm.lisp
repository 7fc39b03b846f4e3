;; GPT-2's MLP input: a LayerNorm with weight and bias as one F.layer_norm (f32 inside,
;; one rounding), then the tanh form of gelu (transformers' gelu_new).
(defconst d 8)
(defparam ln-w (ones [d]))
(defparam ln-b (zeros [d]))

(defun forward (x)
  (gelu (fused-layer-norm x ln-w ln-b :eps 1e-5) :approximate :tanh))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
