;; Layer lists of different models, keyed as torch's nn.Sequential and nn.ModuleList key
;; their items (`downsample.0.`, `downsample.1.`), and a per-layer choice of model under
;; one key (`layers.N.mlp.`): ConvNeXt's downsampling (a layer norm, then a projection),
;; T5's block.layer (self-attention, cross-attention, feed-forward), DeepSeek-V3's dense
;; MLP on the first layers and a mixture of experts on the others.
(defconst dim 8)
(defconst n-layer 3)
(defconst first-k-dense-replace 1)

(defmodel norm (&key (dim 8))
  (defparam weight (ones [dim]))
  (defparam bias (zeros [dim]))
  (defun forward (x) (+ (* x weight) bias)))

(defmodel proj (&key (in 8) (out 8))
  (defparam weight (normal [in out] :std 0.1))
  (defun forward (x) (matmul x weight)))

(defmodel cross (&key (dim 8))
  (defparam weight (normal [dim dim] :std 0.1))
  (defun forward (x memory) (+ x (matmul memory weight))))

(defmodel dense-mlp (&key (dim 8))
  (defparam up (proj :in dim :out (* 2 dim)))
  (defparam down (proj :in (* 2 dim) :out dim))
  (defun forward (x) (down (relu (up x)))))

(defmodel moe (&key (dim 8))
  (defparam gate (proj :in dim :out 2))
  (defparam experts (module-list (dense-mlp :dim dim) (dense-mlp :dim dim)))
  (defun forward (x)
    (let ((p (softmax (gate x))))
      (+ (* (slice p :axis -1 :end 1) (nth experts 0 x))
         (* (slice p :axis -1 :start 1) (nth experts 1 x))))))

(defmodel block (&key (dim 8) (layer-idx 0) (first-dense 1))
  (defparam layer (module-list (norm :dim dim) (cross :dim dim) (norm :dim dim)))
  (defparam mlp (if (< layer-idx first-dense) (dense-mlp :dim dim) (moe :dim dim)))
  (defun forward (x memory)
    (let ((h (nth layer 1 (nth layer 0 x) memory)))
      (+ h (mlp (nth layer 2 h))))))

(defparam downsample (sequential (norm :dim 4) (proj :in 4 :out dim)))
(defparam layers
  (stack (i n-layer) (block :dim dim :layer-idx i :first-dense first-k-dense-replace)))

(defun forward (x memory)
  (for (layer layers) ((h (downsample x))) (layer h memory)))

(defrun train :precision :bf16)
