;; difftest seed=1000669 methods=forward(x)
;; Found by the campaign (seed 1000669), minimized by hand: an `if` whose branches both read
;; a bf16-stored parameter, under :bf16. The policy took the value as an f32 read, so the
;; compiler wrote `F.linear(x, self.w1.float() if self.d == 4 else self.w1.float())`: f32.
;; An `if` of parameter reads is now a parameter read, for contagion and storage, each
;; branch read as its reader reads it: `F.linear(x_bf16, self.w1 if ... else self.w1)`.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
(defconst d 4)
(defparam w1 (normal [d d]) :dtype :bf16)
(defun forward (x) (linear x (if (= d 4) w1 w1)))
(defrun train :precision :bf16)
