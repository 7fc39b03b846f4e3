;; softmax's :dtype. The default, :f32, is an f32 island: torch's softmax(x,
;; dtype=torch.float32), as transformers' eager attention (Llama's) computes it, its
;; weights f32 until they meet a bf16 value. :input is torch's kernel on the value as it
;; is, bf16 under :bf16: a bf16 model's F.softmax(scores), as GPT-2's eager attention runs.
(defparam w (normal [8 8]))
(defun forward (x)
  (let ((scores (matmul x w)))
    (+ (matmul (softmax scores) w) (matmul (softmax scores :dtype :input) w))))
(defrun train :precision :bf16)
