;; Integer math as model configs write it: a rotary width from a fraction of the head
;; (int (* partial-rotary-factor head-dim)), a bucket count from a log, computed in the
;; constructor from the caller's values; integer and boolean tensors made by cast, read as
;; computed (never rounded), and a mask's fraction made a float again.
(defconst head-dim 8)
(defconst partial-rotary-factor 0.5)
(defconst rotary-dim (int (* partial-rotary-factor head-dim)))
(defconst buckets (ceil (log (* 2 head-dim))))
(defparam proj (normal [head-dim rotary-dim]))
(defparam table (normal [buckets rotary-dim]))
(defun forward (x)
  (let ((h (matmul x proj))
        (bucket (mod (cast (* 4.0 (amax x :axes [1])) :i64) buckets))
        (keep (cast (relu h) :bool)))
    (* (where keep h (take table bucket)) (mean (cast keep :f32)))))
(defrun train :precision :bf16)
