;; Attention with a mask built from the input: a padding mask [B S] (1 keeps a token)
;; as booleans, as an additive mask (0 or -inf) made causal, and as booleans restricted
;; to a sliding window; each stays one F.scaled_dot_product_attention call.
(defun keep (attention-mask) (> (reshape attention-mask [2 1 1 5]) 0.5))

(defun padded (q k v attention-mask) (attention q k v (keep attention-mask)))

(defun causal (q k v attention-mask)
  (attention q k v (where (keep attention-mask) 0.0 -inf) :causal true))

(defun windowed (q k v attention-mask)
  (attention q k v (keep attention-mask) :window 2))

(defun forward (q k v attention-mask)
  (+ (padded q k v attention-mask) (causal q k v attention-mask)
     (windowed q k v attention-mask)))

(defrun train :precision :bf16)
