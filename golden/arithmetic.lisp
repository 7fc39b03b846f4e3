;; Arithmetic as people write it: n-ary -, a power with a number exponent (pow or **),
;; mod in consts and conditions, a stack whose layers take a conditional argument, and
;; functions of literals folded when the file compiles.
(defconst n-layer 4)
(defconst window (if (= (mod n-layer 2) 0) 8 16))

(defmodel layer (&key (window 4))
  (defun forward (x) (* x window)))

(defparam layers
  (stack (i n-layer) (layer :window (if (= (mod i 2) 0) window (* 2 i)))))

(defun forward (x)
  (let ((odd (for (i l layers) ((h x)) (if (= (mod i 2) 1) (l h) h))))
    (- (chain layers x) (pow x 2.0) (** x 3) (* odd (log 2.0)) (sqrt n-layer))))
