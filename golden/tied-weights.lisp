;; A tied embedding, as GPT-2's: lm-head.weight is transformer.wte.weight, one nn.Parameter
;; under both state_dict keys, trained as one; a parameter read at any depth.
(defconst vocab 10)
(defconst d 4)

(defmodel embedding (&key (num 10) (dim 4))
  (defparam weight (normal [num dim]))
  (defun forward (ids) (take weight ids)))

(defmodel body (&key (vocab 10) (d 4))
  (defparam wte (embedding :num vocab :dim d))
  (defparam ln (ones [d]))
  (defun forward (ids) (* ln (wte ids))))

(defmodel head (&key (in 4) (out 10))
  (defparam weight (normal [out in]))
  (defun forward (x) (linear x weight)))

(defparam transformer (body :vocab vocab :d d))
(defparam lm-head (head :in d :out vocab))
(tie lm-head.weight transformer.wte.weight)

(defun forward (ids)
  (let ((h (transformer ids)))
    (+ (lm-head h) (linear h transformer.wte.weight))))

(defrun train :precision :bf16)
