;; Lambdas as the real code keeps them: an element of an f32 vector is a 0-d tensor,
;; and a 0-d tensor never decides a dtype (torch's type promotion), so its product with
;; bf16 activations is bf16; it is written as it is, and a GPU's kernel rounds it to bf16
;; as it loads it. `sub.weight` reads a sub-model's parameter, as a tied embedding does.
(defmodel head (&key (d 8) (v 10))
  (defparam weight (normal [v d]) :dtype :bf16)
  (defun forward (x) (linear x weight)))

(defparam head (head :d 8 :v 10))
(defparam lambdas (concat [(full [2] 1.05) (repeat 2 (tensor [0.5 1.0]))]) :numerics :high)

(defun forward (ids)
  (let ((x (take head.weight ids))
        (x (+ (* (+ (at lambdas 0) (at lambdas 1)) x) (* (sigmoid (at lambdas 2)) x))))
    (head x)))

(defrun train :precision :bf16)
