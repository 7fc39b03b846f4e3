;; A gradient inside a loop: with respect to the carried value itself (a descent step per
;; layer), and with respect to an argument the carried value does not depend on (c starts
;; as y and each step multiplies it by d(sum c*x)/dx = c). A carried value that depends on
;; X through the iterations before is a diagnostic (docs/LANGUAGE.md, gradient).
(defmodel blk (&key (d 4)) (defparam w (normal [d d])) (defun forward (x) x))
(defparam blocks (stack 2 (blk :d 4)))
(defun forward (x) (for (layer blocks) ((c x)) (layer (- c (gradient (sum (* c c c)) c)))))
(defun fixed (x y) (for (layer blocks) ((c y)) (layer (* c (gradient (sum (* c x)) x)))))
