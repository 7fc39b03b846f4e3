;; A frozen buffer computed once from the model's arguments and left out of state_dict
;; (`:persistent false`), as transformers holds a rotary model's inv_freq: it moves with the
;; module, a strict load of a checkpoint without it succeeds, and its init computes it again.
;; Stored as any frozen buffer, in its readers' dtype: f32 here, read by an f32 island.
(defmodel rotary (&key (dim 8) (theta 10000.0))
  (defparam inv-freq (/ 1.0 (pow theta (/ (arange 0 dim 2) dim)))
    "the rotary frequencies, one per pair of channels"
    :trainable false :persistent false)
  (defparam scale (ones [dim]) :trainable false)
  (defun forward (x)
    (let ((angles (with-numerics (:sensitivity :high)
                    (* (unsqueeze (arange-of x :axis 0) :axis -1) inv-freq))))
      (* (+ x (cast-run (concat [(cos angles) (sin angles)] :axis -1))) scale))))

(defparam rope (rotary :dim 8))

(defun forward (x) (rope x))

(defrun train :precision :bf16)
