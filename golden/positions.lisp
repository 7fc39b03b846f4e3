;; Learned positions for any length: integer positions from the input's size read
;; from a table with take, and the size of an axis as a value.
(defconst vocab 10)
(defconst d 4)
(defconst n-pos 8)
(defparam wte (normal [vocab d]))
(defparam wpe (normal [n-pos d]))
(defun forward (ids)
  (let ((h (+ (take wte ids) (take wpe (positions ids :axis 1)))))
    (/ h (size ids :axis 1))))
(defrun train :precision :bf16)
