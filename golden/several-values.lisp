;; Several return values: a body ending in a vector [A B] returns a tuple, bound with
;; let destructuring; each value keeps its own dtype (the norms are f32, the states bf16).
;; A sub-model's forward may return several (BERT's pooler), and so may the top forward.
(defconst d 8)

(defmodel pooler (&key (d 8))
  (defparam dense (normal [d d] :std 0.1))
  (defun forward (h)
    "The states as they came, and their mean through a dense layer."
    [h (tanh (matmul (with-numerics (:sensitivity :high) (mean h :axes [1])) dense))]))

(defparam w-in (normal [d d] :std 0.1))
(defparam pool (pooler :d d))

(defun encode (x)
  "The hidden states, and their squared norms summed in f32."
  (let ((h (matmul x w-in)))
    [h (with-numerics (:sensitivity :high) (sum (* h h) :axes [-1]))]))

(defun pooled (x)
  (let (([_ p] (pool (matmul x w-in))))
    p))

(defun forward (x)
  (let (([h norms] (encode x))
        ([states pooled] (pool h)))
    [states pooled norms]))

(defrun train :precision :bf16)
