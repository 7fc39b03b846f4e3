;; A frozen parameter is stored in the dtype every reader reads, and every defun is a
;; public method, a reader too: `w`, read by `f` in f32 and by `f` called in a bf16 region,
;; stays f32; `t`, read only in regions, is stored bf16, and so is `e`, read only through
;; `at` there (an element is read in the dtype its op computes in); `unused`, read only by
;; a value nothing depends on, has no reader and stays f32.
(defparam w (normal [4 4]) :trainable false)
(defparam t (normal [4 4]) :trainable false)
(defparam e (normal [4]) :trainable false)
(defparam unused (normal [4 4]) :trainable false)

(defun f (x) (matmul x w))

(defun forward (x)
  (let ((dead (matmul x unused)))
    (with-numerics (:precision :bf16)
      (* (at e 0) (matmul (f x) t)))))
