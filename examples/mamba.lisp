;; Hugging Face transformers' MambaForCausalLM (models/mamba/modeling_mamba.py, Apache licence
;; 2.0), the slow path (no CUDA kernels, no cache), with its state_dict: a checkpoint loads with
;; strict=True. The constructor takes MambaConfig's names; hidden_act silu, tied embeddings, no
;; padding mask. The causal convolution keeps as many outputs as its input has positions.

(defconst vocab-size 50280)
(defconst hidden-size 768)
(defconst state-size 16)
(defconst num-hidden-layers 32)
(defconst layer-norm-epsilon 1e-5)
(defconst expand 2)
(defconst conv-kernel 4)
(defconst use-bias false)
(defconst use-conv-bias true)
(defconst time-step-rank (int (ceil (/ hidden-size 16))))
(defconst intermediate-size (* expand hidden-size))

(defmodel linear-layer (&key (in-features 768) (out-features 768) (with-bias false))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defparam bias (zeros [out-features]) :when with-bias)
  (defun forward (x) (if with-bias (linear x weight bias) (linear x weight))))

(defmodel conv1d-layer (&key (channels 1536) (kernel 4) (with-bias true))
  (defparam weight (normal [channels 1 kernel] :std 0.02))
  (defparam bias (zeros [channels]) :when with-bias)
  ;; causal: K - 1 zeros on both sides, the first L outputs kept
  (defun forward (x)
    (slice (if with-bias
               (conv1d x weight bias :padding (- kernel 1) :groups channels)
               (conv1d x weight :padding (- kernel 1) :groups channels))
           :axis -1 :end (size x :axis -1))))

(defun rms-normalized (x &key (eps 1e-5))
  (with-numerics (:sensitivity :high)
    (* x (rsqrt (+ (mean (square x) :axes [-1] :keepdims true) eps)))))

(defmodel mamba-rms-norm (&key (dim 768) (eps 1e-5))
  (defparam weight (ones [dim]))
  (defun forward (x) (* weight (rms-normalized x :eps eps))))

(defmodel mamba-mixer (&key (hidden 768) (inner 1536) (state 16) (kernel 4) (rank 48)
                            (use-bias false) (use-conv-bias true))
  (defparam in-proj (linear-layer :in-features hidden :out-features (* 2 inner) :with-bias use-bias))
  (defparam conv1d (conv1d-layer :channels inner :kernel kernel :with-bias use-conv-bias))
  (defparam x-proj (linear-layer :in-features inner :out-features (+ rank (* 2 state))))
  (defparam dt-proj (linear-layer :in-features rank :out-features inner :with-bias true))
  (defparam A_log (log (outer (ones [inner]) (arange 1 (+ state 1))))
    "S4D real initialization: A = -exp(A_log) is -1, -2, ... on every row")
  (defparam D (ones [inner]))
  (defparam out-proj (linear-layer :in-features inner :out-features hidden :with-bias use-bias))
  (defun forward (h)
    (let ((projected (swap-axes (in-proj h) 1 2))
          (x (swap-axes (silu (conv1d (slice projected :axis 1 :end inner))) 1 2))
          (gate (swap-axes (slice projected :axis 1 :start inner) 1 2))
          (ssm (x-proj x))
          (time-step (slice ssm :axis -1 :end rank))
          (B (slice ssm :axis -1 :start rank :end (+ rank state)))
          (C (slice ssm :axis -1 :start (+ rank state)))
          ;; the time step [B I L], its bias added in its dtype, as mamba_selective_scan
          (dt (unsqueeze (softplus (+ (matmul dt-proj.weight (swap-axes time-step 1 2))
                                      (unsqueeze dt-proj.bias :axis -1)))
                         :axis -1))
          ;; in f32: the discretized decay and input [B I L N], scanned along L
          ([discrete-A deltaB-u]
           (with-numerics (:sensitivity :high)
             [(exp (* (unsqueeze (- (exp A_log)) :axis 1) dt))
              (* dt (unsqueeze B :axis 1) (unsqueeze (swap-axes x 1 2) :axis -1))]))
          (states (transpose (linear-scan discrete-A deltaB-u :axis 2) [0 2 1 3]))
          (y (squeeze (matmul states (unsqueeze C :axis -1)) :axis -1))
          (gate (silu gate)))
      ;; the skip and the gate in f32, as mamba_selective_scan's D.float()
      (out-proj (with-numerics (:sensitivity :high) (* (+ y (* x D)) gate))))))

(defmodel mamba-block (&key (hidden 768) (inner 1536) (state 16) (kernel 4) (rank 48)
                            (eps 1e-5) (use-bias false) (use-conv-bias true))
  (defparam norm (mamba-rms-norm :dim hidden :eps eps))
  (defparam mixer (mamba-mixer :hidden hidden :inner inner :state state :kernel kernel
                               :rank rank :use-bias use-bias :use-conv-bias use-conv-bias))
  ;; residual_in_fp32: the stream is f32, each block reading it in the run's dtype
  (defun forward (x)
    (let ((out (mixer (norm (cast-run x)))))
      (with-numerics (:sensitivity :high) (+ x out)))))

(defmodel mamba-model (&key (vocab 50280) (hidden 768) (inner 1536) (state 16) (kernel 4)
                            (rank 48) (depth 32) (eps 1e-5) (use-bias false)
                            (use-conv-bias true))
  (defparam embeddings (embedding :num-embeddings vocab :embedding-dim hidden))
  (defparam layers (stack depth (mamba-block :hidden hidden :inner inner :state state
                                             :kernel kernel :rank rank :eps eps
                                             :use-bias use-bias :use-conv-bias use-conv-bias)))
  (defparam norm_f (mamba-rms-norm :dim hidden :eps eps))
    ;; norm_f on the f32 stream: its weight multiplies in f32 (MambaRMSNorm's input dtype)
  (defun forward (input-ids)
    (let ((normalized (rms-normalized (chain layers (cast (embeddings input-ids) :f32)) :eps eps)))
      (with-numerics (:sensitivity :high) (* norm_f.weight normalized)))))

(defmodel embedding (&key (num-embeddings 50280) (embedding-dim 768))
  (defparam weight (normal [num-embeddings embedding-dim] :std 0.02))
  (defun forward (ids) (take weight ids)))

(defparam backbone (mamba-model :vocab vocab-size :hidden hidden-size :inner intermediate-size
                                :state state-size :kernel conv-kernel :rank time-step-rank
                                :depth num-hidden-layers :eps layer-norm-epsilon
                                :use-bias use-bias :use-conv-bias use-conv-bias))
(defparam lm-head (linear-layer :in-features hidden-size :out-features vocab-size))
;; tie_word_embeddings (MambaConfig's default): one parameter under both keys
(tie lm-head.weight backbone.embeddings.weight)

(defun forward (input-ids) (lm-head (backbone input-ids)))

(defrun train :precision :bf16)
(defrun exact :precision :f32)
(defrun generate :precision :bf16 :generate true)
