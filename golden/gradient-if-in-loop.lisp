;; The gradient through a stack whose layer branches: the adjoint loop computes each
;; layer's forward again, and the backward `if` reads the transpose its forward branch
;; made, under the same condition.
(defmodel blk (&key (d 4))
  (defparam w (normal [d d]))
  (defun forward (x) (if (= d 4) (* x x) (matmul x (transpose w [1 0])))))

(defparam blocks (stack 2 (blk :d 4)))

(defun forward (x) (gradient (sum (chain blocks x)) x))
