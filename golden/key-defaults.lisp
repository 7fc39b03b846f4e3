;; A &key argument's default is a value the caller can change: sizes and bounds
;; that read one are written in terms of it, never folded from the default.
(defparam table (normal [8 4]))

(defun rows (&key (start 0) (count 1))
  "The rows start .. start + count of the table."
  (slice table :start start :end (+ start count)))

(defun split (x &key (groups 0))
  (reshape x [groups -1]))

(defun forward (x)
  (* (split x :groups 2) (sum (rows :start 2 :count 2))))
