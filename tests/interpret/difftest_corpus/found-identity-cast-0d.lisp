;; difftest seed=301210 methods=forward(x,ids)
;; Found by the campaign (seed 301210), minimized: (at v 0) of a bf16-stored vector is a bf16
;; 0-d element; casting it to bf16 changes nothing, so beside the f32 input x it decides no
;; dtype and the minimum is f32.
;; found: dtype cuda:forward: got torch.bfloat16 (2, 4), want torch.float32 (2, 4)
(defconst d 4)
(defparam v (normal [d]) :dtype :bf16)
(defun forward (x ids) (minimum x (cast (at v 0) :bf16)))
(defrun train :precision :bf16)
