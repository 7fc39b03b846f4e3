;; A 0-d f32 operand of a bf16 op is read in bf16 on either side of it, as a GPU's kernel
;; converts it as it loads it. The cuda module writes the cast of a later operand
;; (torch's CPU kernel would read it as a scalar, in f32, and round only the product) and
;; leaves the first to the kernel; the held targets round both.
(defparam v (normal [4]) :numerics :high)
(defparam w (normal [4 4]))

(defun forward (x)
  (let ((h (linear x w)))
    (+ (* (sigmoid (at v 2)) h)   ; the first operand: the kernel converts it
       (* h (sigmoid (at v 2)))   ; a later one: written with its cast down
       (* h (at v 1)))))

(defrun train :precision :bf16)
