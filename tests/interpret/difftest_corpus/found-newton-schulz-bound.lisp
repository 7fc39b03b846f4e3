;; difftest seed=1071379 methods=forward(x,ids)
;; Found by the campaign of h-camp (seed 1071379), minimized: newton-schulz iterates in bf16 under
;; either precision, so its training gradient is as noisy as a bf16 one; the checker gave the
;; source the f32 bound, since no bf16 keyword is written in it.
;; found: backward cuda:forward: w1: max |diff| 0.000943: got [-0.109375, 0.09814453125, 0.051513671875, 0.10546875, -0.2421875, -0.054931640625], want [-0.10947221517562866, 0.0981624573469162
(defconst d 4)
(defparam w1 (normal [d d]))
(defun forward (x ids) (newton-schulz w1 :steps 1))
