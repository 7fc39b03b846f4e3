;; A parameter's :dtype is its storage: the embedding is a bf16 nn.Parameter (as
;; nn.Embedding(...).bfloat16()), read without a cast by bf16 code and trained in bf16;
;; the head stays an f32 master. An initializer may concatenate 1-D parts.
(defconst vocab 32)
(defconst d 16)
(defconst n-layer 2)
(defparam wte (normal [vocab d]) :dtype :bf16)
(defparam head (normal [d vocab] :std 0.02))
(defparam scalars
  (concat [(full [n-layer] 1.05) (tensor [0.5 1.0]) (zeros [1]) (full [3] -1.5)]))

(defun forward (ids)
  (* (matmul (take wte ids) head) (slice scalars :end 1)))

(defrun train :precision :bf16)
