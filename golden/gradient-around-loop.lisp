;; A value read from around a loop collects its contributions in a sum the adjoint loop
;; carries, even where a carried value starts as that same value: here x * x * x, whose
;; gradient 3x^2 is the carried h's share plus the sum's.
(defmodel blk (&key (d 4))
  (defparam w (normal [d d]))
  (defun forward (x) x))

(defparam blocks (stack 2 (blk :d 4)))

(defun forward (x) (gradient (sum (for (layer blocks) ((h x)) (* h x))) x))
