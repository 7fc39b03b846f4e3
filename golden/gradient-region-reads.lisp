;; Under :f32, X read inside a bf16 region: its gradient is the sum of its readers'
;; contributions, computed with the marks the readers share, here in the region, so it is
;; bf16 however many times X is read (docs/LANGUAGE.md, gradient).
(defun forward (x) (gradient (sum (with-numerics (:precision :bf16) (concat [x (tanh x)] :axis 1))) x))
(defun twice (x) (gradient (sum (with-numerics (:precision :bf16) (* x (tanh x)))) x))
(defun once (x) (gradient (sum (with-numerics (:precision :bf16) (tanh x))) x))
(defun apart (x) (gradient (sum (+ (with-numerics (:precision :bf16) (tanh x)) x)) x))
