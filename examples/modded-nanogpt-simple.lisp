;; The GPT of modded-nanogpt's simple track (records/track_3_optimization/
;; train_gpt_simple.py of KellerJordan/modded-nanogpt, MIT licence), with the real
;; module's state_dict, so a real checkpoint loads with strict=True. Its Linear
;; layers start from normal(0, 0.02) rather than nn.Linear's uniform draw.
(require sexpgpu/nn)

(defconst vocab-size 50304)
(defconst num-layers 12)
(defconst model-dim 768)
(defconst head-dim 128)

(defmodel norm (&key (dim 768))
  (defparam gains (ones [dim]))
  (defun forward (x) (fused-rms-norm x gains)))

(defmodel linear-layer (&key (in-features 768) (out-features 768))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defparam bias (zeros [out-features]))
  (defun forward (x) (linear x weight bias)))

(defmodel rotary (&key (dim 128))
  (defparam angular-freq
    (concat [(pow (/ 1 1024) (linspace (// dim 4))) (zeros [(// dim 4)])])
    :trainable false)
  (defun forward (x)
    "x [batch time head dim], rotated in f32"
    (with-numerics (:sensitivity :high)
      (let ((theta (reshape (outer (arange-of x :axis 1) angular-freq) [1 -1 1 (// dim 2)]))
            (x1 (slice x :axis -1 :end (// dim 2)))
            (x2 (slice x :axis -1 :start (// dim 2))))
        (concat [(+ (* x1 (cos theta)) (* x2 (sin theta)))
                 (+ (* x1 (- (sin theta))) (* x2 (cos theta)))]
                :axis 3)))))

(defmodel attention-layer (&key (dim 768) (head-dim 128))
  (defparam q (linear-layer :in-features dim :out-features dim))
  (defparam k (linear-layer :in-features dim :out-features dim))
  (defparam v (linear-layer :in-features dim :out-features dim))
  (defparam proj (linear-layer :in-features dim :out-features dim))
  (defparam rotary (rotary :dim head-dim))
  (defun heads (x) (transpose (reshape x [0 0 -1 head-dim]) [0 2 1 3]))
  (defun forward (x)
    (let ((qs (rotary (fused-rms-norm (reshape (q x) [0 0 -1 head-dim]))))
          (ks (rotary (fused-rms-norm (reshape (k x) [0 0 -1 head-dim]))))
          (y (attention (transpose qs [0 2 1 3]) (transpose ks [0 2 1 3])
                        (heads (v x)) :scale 0.12 :causal true)))
      (proj (reshape (transpose y [0 2 1 3]) [0 0 -1])))))

(defmodel mlp (&key (dim 768))
  (defparam fc (linear-layer :in-features dim :out-features (* 4 dim)))
  (defparam proj (linear-layer :in-features (* 4 dim) :out-features dim))
  (defun forward (x) (proj (square (relu (fc x))))))

(defmodel block (&key (dim 768) (head-dim 128))
  (defparam attn (attention-layer :dim dim :head-dim head-dim))
  (defparam mlp (mlp :dim dim))
  (defparam norm1 (norm :dim dim))
  (defparam norm2 (norm :dim dim))
  (defun forward (x)
    (let ((x (+ x (attn (norm1 x)))))
      (+ x (mlp (norm2 x))))))

(defmodel embedding (&key (num 50304) (dim 768))
  (defparam weight (normal [num dim]) :dtype :bf16)
  (defun forward (ids) (take weight ids)))

(defparam embed (embedding :num vocab-size :dim model-dim))
(defparam blocks (stack num-layers (block :dim model-dim :head-dim head-dim)))
(defparam proj (linear-layer :in-features model-dim :out-features vocab-size))
(defparam norm1 (norm :dim model-dim))
(defparam norm2 (norm :dim model-dim))

(defun forward (inputs)
  (let ((x (chain blocks (norm1 (embed inputs))))
        (logits (cast (proj (norm2 x)) :f32)))
    (* 15 logits (rsqrt (+ (square logits) 225)))))

(defun loss (inputs targets)
  (cross-entropy (reshape (forward inputs) [-1 vocab-size]) (reshape targets [-1])
                 :reduction :sum))

(defrun train :precision :bf16)
