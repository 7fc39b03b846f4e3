;; A gradient is lowered like the forward, so its dtype is the dtype its last backward node
;; computes in, as any value's: under :bf16 the gradient of an f32 x through a parameter is
;; bf16, as the forward's values are (torch.autograd.grad would give x's dtype). Cast it
;; where f32 is wanted; a sum with no parameter in it keeps x's f32.
(defparam w (normal [4 4]))

(defun forward (x) (gradient (sum (matmul x w)) x))

(defun as-f32 (x) (cast (gradient (sum (matmul x w)) x) :f32))

(defun plain (x) (gradient (sum (* x x)) x))

(defrun train :precision :bf16)
