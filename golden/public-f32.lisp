;; A defun the program calls only with bf16, public under its source name: called alone
;; with f32 it computes what the source gives for f32 (an f32 square), on every target.
;; cuda's one method serves both (torch squares each in its argument's dtype); a held
;; target holds bf16 in f32 tensors, so its bf16 callers call helper_bf16, which rounds.
(defparam w (normal [4 4]))
(defun helper (x) (square x))
(defun forward (x) (helper (matmul x w)))
(defrun train :precision :bf16)
