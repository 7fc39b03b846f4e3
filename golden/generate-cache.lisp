;; A run that generates: each causal attention keeps its keys and values in the cache, in
;; the dtype it reads them in (bf16 here, a literal beside the call), positions over the
;; sequence axis start where the cache ends, and the value the last attention feeds is read
;; at its last position (lm_head's logits_to_keep=1) while sx2torch.runtime.generate runs.
(defconst vocab 64)
(defconst dim 32)
(defconst heads 4)

(defparam embed (normal [vocab dim] :std 0.02))
(defparam positions-table (normal [16 dim] :std 0.02))
(defparam qkv (normal [(* 3 dim) dim] :std 0.02))
(defparam window-qkv (normal [(* 3 dim) dim] :std 0.02))
(defparam head (normal [vocab dim] :std 0.02))

(defun split-heads (x) (transpose (reshape x [0 0 heads -1]) [0 2 1 3]))

(defun attend (x w &key (window 0))
  (let ((q (split-heads (linear x (slice w :axis 0 :end dim))))
        (k (split-heads (linear x (slice w :axis 0 :start dim :end (* 2 dim)))))
        (v (split-heads (linear x (slice w :axis 0 :start (* 2 dim)))))
        (y (if (> window 0)
               (attention q k v :window window)
               (attention q k v :causal true))))
    (+ x (reshape (transpose y [0 2 1 3]) [0 0 -1]))))

(defun forward (ids)
  (let ((x (+ (take embed ids) (take positions-table (positions ids :axis 1))))
        (x (attend (attend x qkv) window-qkv :window 3)))
    (linear (rms-norm x) head)))

(defrun chat :precision :bf16 :generate true)
(defrun chat-exact :precision :f32 :generate true)
