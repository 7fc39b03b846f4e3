;; 6.5: under :f32 a bf16 region computes in bf16; a reader outside casts it back up.
(defparam w (normal [8 8]))

(defun project (x)
  (with-numerics (:precision :bf16)
    (relu (matmul x w))))

(defun forward (x)
  (+ (project x) x))

(defrun train :precision :f32)
