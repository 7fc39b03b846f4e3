;; difftest seed=1060781 methods=forward(x,ids);helper(x)
;; Found by replaying the b3f533d campaign's programs (seed 1060781, that commit's generator) on
;; main, rewritten small: a helper the program calls only inside a loop whose carried value
;; becomes bf16 (a layer's matmul). The interpreter finds the carried dtypes by trial rounds of
;; the body, and those rounds, run with the f32 start, were recorded as calls of the helper with
;; f32, so it took the helper for one the program calls with f32 too, without the entry cast;
;; the compiler casts at entry (docs/LANGUAGE.md, Specializations). The trial rounds are not
;; calls the program makes.
;; found: dtype cuda:helper: got torch.bfloat16 (2, 4), want torch.float32 (2, 4)
(defmodel blk () (defparam w (normal [4 4])) (defun forward (x) (matmul x w)))
(defparam blocks (stack 2 (blk)))
(defun helper (x) (pow x 2))
(defun forward (x ids) (for (layer blocks) ((c x)) (layer (helper c))))
(defrun train :precision :bf16)
