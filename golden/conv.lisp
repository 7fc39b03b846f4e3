;; Convolutions are fused kernels as linear is: under :bf16 each reads bf16, accumulates in
;; f32 with its bias and stores bf16 once. Max pooling picks elements (exact); the mean of a
;; window rounds once. A depthwise causal conv1d (Mamba's) is :groups and a slice.
(defconst channels 8)
(defparam stem-w (normal [channels 3 3 3] :std 0.2))
(defparam stem-b (zeros [channels]))
(defparam mix-w (normal [channels 1 4] :std 0.5))
(defparam mix-b (zeros [channels]))

(defun forward (image)
  (let ((h (relu (batch-norm (conv2d image stem-w stem-b :padding 1) :axes [0 2 3])))
        (pooled (avg-pool2d (max-pool2d h 2) 2 :stride 1))
        (seq (reshape (interpolate pooled :size [4 4] :mode :bilinear) [0 channels -1])))
    (slice (conv1d seq mix-w mix-b :padding 3 :groups channels) :axis -1 :end -3)))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
