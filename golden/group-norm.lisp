;; Wav2Vec2's first feature layer: a convolution, then GroupNorm with one group per
;; channel (nn.GroupNorm(512, 512) there), then gelu. group-norm is F.group_norm in an
;; f32 island, as bf16 autocast runs it; the next bf16 op casts its f32 output down.
(defconst channels 4)
(defparam conv (normal [channels 1 3]))
(defparam norm-weight (ones [channels]))
(defparam norm-bias (zeros [channels]))
(defun forward (x)
  (gelu (group-norm (conv1d x conv :stride 2) channels norm-weight norm-bias)))
(defun norm-gradient (x)
  (gradient (sum (forward x)) norm-weight))
(defrun train :precision :bf16)
