;; 6.7: a :numerics :high parameter is read from its f32 master, and the nodes
;; that read it compute in f32.
(defparam w (normal [8 8]))
(defparam gain (ones [8]) :numerics :high)

(defun forward (x)
  (* (matmul x w) gain))

(defrun train :precision :bf16)
