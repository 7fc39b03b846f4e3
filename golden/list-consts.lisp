;; Lists in consts and &keys: per-stage depths and widths as ConvNeXt's and Swin's configs
;; give them, read with (at LIST I) and (len LIST) in stack counts, shapes and layer
;; arguments, and (in I LIST) as Qwen2-MoE's mlp_only_layers. The constructor takes lists:
;; ListConsts(depths=[1, 1], hidden_sizes=[4, 8]).
(defconst depths [2 1 3] "blocks per stage")
(defconst hidden-sizes [8 16 16] "each stage's width")
(defconst gated-layers [0 2] "the blocks of each stage that gate")
(defconst in-size 4)

(defmodel block (&key (dim 8) (idx 0) (gated [0]))
  (defparam w (normal [dim dim] :std 0.02))
  (defparam gate (ones [dim]) :when (in idx gated))
  (defun forward (x)
    (let ((h (+ x (relu (matmul x w)))))
      (if (in idx gated) (* h gate) h))))

(defmodel stage (&key (in-dim 8) (dim 8) (depth 1) (gated [0]))
  (defparam down (normal [in-dim dim] :std 0.02))
  (defparam blocks (stack (i depth) (block :dim dim :idx i :gated gated)))
  (defun forward (x) (chain blocks (matmul x down))))

(defparam stages
  (stack (i (len depths))
    (stage :in-dim (if (= i 0) in-size (at hidden-sizes (- i 1)))
           :dim (at hidden-sizes i)
           :depth (at depths i)
           :gated gated-layers)))
(defparam head (normal [(at hidden-sizes -1) 2] :std 0.02)
  "the classifier, on the last stage's width")

(defun forward (x &key (scales [1.0 0.5 0.25]))
  (matmul (for (i stage stages) ((h x)) (* (stage h) (at scales i))) head))
