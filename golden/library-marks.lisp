;; 6.8: the library's sensitive functions compute in f32 under :bf16; rms-norm
;; and layer-norm keep only their statistics in f32.
(require sexpgpu/nn)
(defparam w (normal [8 8]))

(defun forward (x)
  (let ((h (matmul x w))
        (a (softmax h))
        (b (log-softmax h :axis -1))
        (c (logsumexp h :axes [-1] :keepdims true))
        (d (softcap h 15.0))
        (e (rms-norm h))
        (f (layer-norm h))
        (g (batch-norm h)))
    (+ a b c d e f g)))

(defun loss (x labels)
  (cross-entropy (forward x) labels))

(defrun train :precision :bf16)
