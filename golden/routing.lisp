;; Routing, as a mixture of experts' router does it: the top 2 of the router's f32
;; probabilities (values and indices, two values), renormalized; the tokens of one
;; expert picked by index, processed, and added back at their rows; argmax and cumsum.
(defconst d 4)
(defconst n-experts 3)
(defparam router (normal [n-experts d] :std 0.5))
(defparam expert (normal [d d] :std 0.5))

(defun forward (x tokens)
  (let ((logits (linear x router))
        (probs (with-numerics (:sensitivity :high) (softmax logits)))
        ([top chosen] (topk probs 2))
        (weights (/ top (sum top :axes [-1] :keepdims true)))
        (picked (index-select x tokens))
        (out (index-add (zeros-like x) tokens (matmul picked expert))))
    [(scatter-add (zeros-like probs) chosen weights)
     chosen
     (argmax logits)
     (cumsum weights)
     (gather out (reshape chosen [-1 2]) :axis 1)]))

(defrun train :precision :bf16)
