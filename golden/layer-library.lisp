;; The layer library: torch.nn's layers under their class names, their sizes in torch's
;; order or by key, with torch's state_dict keys, shapes and default initialisation (the
;; same bits under one seed), and no model of the source's. Under :bf16 each layer casts
;; its f32 master weights where it reads them.
(defconst vocab 32)
(defconst d 16)

(defparam embed (Embedding vocab d))
(defparam norm (RMSNorm d :eps 1e-6))
(defparam up-proj (Linear d (* 4 d) :bias false))
(defparam down-proj (Linear :in-features (* 4 d) :out-features d))
(defparam final-norm (LayerNorm d))

(defun forward (ids)
  (let ((h (embed ids)))
    (final-norm (+ h (down-proj (gelu (up-proj (norm h))))))))

(defrun train :precision :bf16)
