;; difftest seed=1057724 methods=forward(x,ids);helper(x)
;; Found by replaying the b3f533d campaign's programs (seed 1057724, that commit's generator) on
;; main: (+ (with-numerics (:sensitivity :high) (matmul x w1)) (neg (matmul x w1))) of a bf16
;; stored w1 cancels, so w1's gradient is zero but for the two products' roundings; the module's
;; loss.backward() and torch.autograd on the interpreter round that cancellation apart (one bf16
;; ulp of the terms, 0.0156, against 0.0). Like found-ill-conditioned-layer-norm-backward, an
;; ill-conditioned gradient of the training backward (differentiated from the lowered graph,
;; SexpGPU's page on gradient: the two need not agree bit for bit), not a miscompile: the rules' own
;; gradient and the forward values agree. Kept to be compiled and run.
;; found: backward cuda:forward: w1: max |diff| 0.0625: got [-0.015625, 0.015625, 0.0, 0.0, 0.0, 0.0], want [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
;; expect: no-internal-error
(defconst d 4) (defconst flag true) (defmodel blk (&key (d 4) (idx 0)) (defparam w (normal [d d]) :trainable false) (defun forward (x &key (k 1.0)) (if (= idx 1) (* x k) x))) (defparam sub (blk :d d)) (defparam blocks (stack (i 2) (blk :d d :idx i))) (defparam w1 (normal [d d]) :dtype :bf16) (defparam w2 (normal [d d])) (defparam v (normal [d]) :numerics :high) (defparam table (normal [8 d]) :numerics :high) (defun helper (x &key (k 0.5)) (neg (matmul x w1))) (defun forward (x ids) (gradient (sum (for (layer blocks) ((c (matmul (- (+ (with-numerics (:sensitivity :high) (matmul x w1)) (neg (matmul x w1))) (square (square (- x v)))) w2))) (layer (* c x)))) x)) (defrun train :precision :bf16)
