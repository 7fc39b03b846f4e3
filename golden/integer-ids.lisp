;; 6.2: integer tensors are never cast: ids gather rows, labels feed cross-entropy.
(defconst vocab 16)
(defconst d 8)
(defparam table (normal [vocab d]))
(defparam head (normal [d vocab] :std 0.1))

(defun forward (ids)
  (matmul (take table ids) head))

(defun loss (ids labels)
  (cross-entropy (reshape (forward ids) [-1 vocab]) (reshape labels [-1])))

(defrun train :precision :bf16)
