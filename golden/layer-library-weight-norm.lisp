;; Wav2Vec2's positional convolution: torch's weight_norm of a grouped Conv1d over its
;; kernel axis (:dim 2), written as torch writes it, so its keys are torch's
;; (conv.parametrizations.weight.original0, g, and original1, v) and g is computed from
;; the drawn v. Under :bf16 the weight is computed in f32 from the f32 g and v and
;; rounded where the convolution reads it, as bf16 autocast runs the module.
(defconst hidden-size 16)
(defconst num-conv-pos-embeddings 4)
(defconst num-conv-pos-embedding-groups 2)

(defparam conv
  (weight-norm (Conv1d hidden-size hidden-size num-conv-pos-embeddings
                       :padding (// num-conv-pos-embeddings 2)
                       :groups num-conv-pos-embedding-groups)
               :name weight :dim 2))

;; x [batch, hidden, time]; an even kernel gives one step too many, which is dropped
(defun forward (x)
  (gelu (slice (conv x) :axis -1 :end -1)))

(defrun train :precision :bf16)
