;; The layer library's convolutions and group norm, a UNet's down and up step: Conv2d,
;; GroupNorm and ConvTranspose2d with torch's keys and default initialisation. GroupNorm
;; computes in an f32 island, as bf16 autocast runs it.
(defconst channels 3)
(defconst width 8)

(defparam conv-in (Conv2d channels width 3 :padding 1))
(defparam norm (GroupNorm 2 width))
(defparam down (Conv2d width width 2 :stride 2 :bias false))
(defparam up (ConvTranspose2d width channels 2 :stride 2))

(defun forward (x)
  (up (silu (down (norm (conv-in x))))))

(defrun train :precision :bf16)
