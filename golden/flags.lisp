;; A flag: a boolean const read only when the module runs, so setting it on a built
;; module (model.split = True) changes the next forward, as modded-nanogpt's split_embed.
(defconst vocab 10)
(defconst d 4)
(defflag split false "the input embedding is embed, not the shared table")
(defparam shared (normal [vocab d]))
(defparam embed (normal [vocab d]))
(defparam out (normal [vocab d]))
(defun forward (ids)
  (let ((x (if split (take embed ids) (take shared ids))))
    (linear (tanh x) out)))
(defrun train :precision :bf16)
