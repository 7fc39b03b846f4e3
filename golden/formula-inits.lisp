;; Initializers by formula: a fresh model's tables are computed as the real code computes
;; them, not zeros that only a checkpoint fills. Mamba's A_log is the log of 1..d-state on
;; every row; Whisper's sinusoidal positions are the sines and cosines of positions times
;; log-spaced frequencies, side by side (concat's :axis); arithmetic mixes initializers
;; and numbers. Each is the torch call, in f32.
(defconst d-inner 6)
(defconst d-state 4)
(defconst length 5)
(defconst channels 8)
(defconst increment (/ 9.210340371976184 (- (// channels 2) 1)) "log(10000) / (C/2 - 1)")

(defparam a-log (log (outer (ones [d-inner]) (arange 1 (+ d-state 1))))
  "Mamba's A_log: A = -exp(A_log) is -1, -2, ... on every row")
(defparam positions
  (concat [(sin (outer (arange 0 length) (exp (* (arange 0 (// channels 2)) (- 0.0 increment)))))
           (cos (outer (arange 0 length) (exp (* (arange 0 (// channels 2)) (- 0.0 increment)))))]
          :axis 1)
  :trainable false)
(defparam decay (- 1.0 (/ (arange 0 d-state) d-state)))

(defun forward (x)
  (* x (exp (- a-log)) decay (sum positions)))
