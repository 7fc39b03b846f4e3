;; A small ResNet: a convolutional stem, residual blocks of two 3x3 convolutions with batch
;; statistics (nn.BatchNorm2d in training mode, without running averages), global average
;; pooling and a linear classifier. Its parameters have the names and layouts of nn.Conv2d,
;; nn.BatchNorm2d and nn.Linear, so a hand-written PyTorch module's state_dict loads.

(defconst in-channels 1)
(defconst channels 16)
(defconst depth 2)
(defconst num-classes 4)

(defmodel conv-layer (&key (in-channels 16) (out-channels 16) (std 0.1))
  (defparam weight (normal [out-channels in-channels 3 3] :std std))
  (defparam bias (zeros [out-channels]))
  (defun forward (x) (conv2d x weight bias :padding 1)))

(defmodel batch-norm-2d (&key (num-features 16) (eps 1e-5))
  (defparam weight (ones [num-features]))
  (defparam bias (zeros [num-features]))
  (defun forward (x)
    (+ (* (batch-norm x :axes [0 2 3] :eps eps) (reshape weight [-1 1 1]))
       (reshape bias [-1 1 1]))))

(defmodel basic-block (&key (channels 16))
  (defparam conv1 (conv-layer :in-channels channels :out-channels channels))
  (defparam bn1 (batch-norm-2d :num-features channels))
  (defparam conv2 (conv-layer :in-channels channels :out-channels channels))
  (defparam bn2 (batch-norm-2d :num-features channels))
  (defun forward (x) (relu (+ x (bn2 (conv2 (relu (bn1 (conv1 x)))))))))

(defmodel linear-layer (&key (in-features 16) (out-features 4))
  (defparam weight (normal [out-features in-features] :std 0.1))
  (defparam bias (zeros [out-features]))
  (defun forward (x) (linear x weight bias)))

(defparam stem (conv-layer :in-channels in-channels :out-channels channels :std 0.3))
(defparam stem-bn (batch-norm-2d :num-features channels))
(defparam blocks (stack depth (basic-block :channels channels)))
(defparam head (linear-layer :in-features channels :out-features num-classes))

;; the global average pooling sums in f32, rounded once where it meets the head
(defun forward (images)
  (let ((h (chain blocks (max-pool2d (relu (stem-bn (stem images))) 2))))
    (head (with-numerics (:sensitivity :high) (mean h :axes [2 3])))))

(defun loss (images labels) (cross-entropy (forward images) labels))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
