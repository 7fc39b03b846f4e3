;; difftest seed=1058707 methods=forward(x,ids)
;; Minimized from the campaign at b3f533d: the adjoint loop computes the layer again, an if whose value nothing reads; the names pass took it as dead and gave its name to the (* x 3) inside its else branch, which the branch end then overwrote before the backward read it.
;; found: value cuda:forward: max |diff| 4.34: got [-4.40625, 0.0341796875, 1.71875, 0.039306640625, -0.984375, -0.059814453125], want [-1.9140625, -1.1484375, 0.2119140625, 0.41015625, -0.0
(defconst d 4)
(defmodel blk (&key (d 4) (idx 0))
(defun forward (x) (if (= idx 1) (* x 3) (cos (* x 3)))))
(defparam blocks (stack (i 2) (blk :d d :idx i)))
(defun forward (x ids) (gradient (mean (for (layer blocks) ((c x)) (layer c))) x))
