;; An `if` whose branches read parameters is a parameter read: under :bf16 the linear that
;; reads it computes in bf16 (contagion), each branch reading its parameter as the linear
;; does; f32 from the masters where a branch is :numerics :high; a frozen one read so is
;; stored bf16. Returned, the `if` is a value: the join of its parameters' dtypes.
(defparam w (normal [4 4]))
(defparam s (normal [4 4]) :dtype :bf16)
(defparam hi (normal [4 4]) :numerics :high)
(defparam f (normal [4 4]) :trainable false)
(defconst wide false)

(defun high (x) (linear x (if wide hi w)))

(defun chosen (x) (if wide w s))

(defun forward (x)
  (+ (linear x (if wide w s)) (linear x (if wide f f))))

(defrun train :precision :bf16)
