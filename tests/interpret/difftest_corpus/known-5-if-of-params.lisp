;; difftest seed=1000669 methods=forward(x)
;; Found by the campaign (seed 1000669), minimized by hand: an `if` whose branches both read
;; a bf16-stored parameter, under :bf16. `(linear x w1)` reads it in bf16 and computes in bf16;
;; through the `if`, the policy takes the value as an f32 read, so the compiler writes
;; `F.linear(x, self.w1.float() if self.d == 4 else self.w1.float())`: f32. The interpreter
;; gives bf16. (With an f32-stored w1 the compiler and the interpreter agree on f32, where
;; `(linear x w1)` is bf16: the same question.) Not fixed yet: an `if` of parameter reads
;; would be a parameter read for contagion, cast in each branch.
;; found: dtype cuda:forward: got torch.float32 (2, 4), want torch.bfloat16 (2, 4)
;; known: an if choosing between parameters reads them as their f32 masters under :bf16
(defconst d 4)
(defparam w1 (normal [d d]) :dtype :bf16)
(defun forward (x) (linear x (if (= d 4) w1 w1)))
(defrun train :precision :bf16)
