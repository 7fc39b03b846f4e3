"""The gradient pass: each GRADIENT node trace left, `(gradient Y X)`, becomes the backward
of Y with respect to X, written where the form was, before the policy runs, so the policy
lowers it like the forward (6.9).

Each backward node carries the frames of the forward node it differentiates, then the frames
of the `with-numerics` forms wrapped directly around the `gradient` form (the node's marks),
which are innermost and so win: such a form stamps its marks on every node the expansion
writes, and not on Y's forward, which trace traced as it would be without them (so in
energy.lisp the forward runs in bf16 and the sweep in f32). The derivative rules live in the
ops' registry entries. Trace traced the defun calls inside Y in place, so the backward sees
their nodes. The nodes nothing reads any longer are pruned after.

The pass is run by gradient/expansion.py; the backward by gradient/backward.py, with the
adjoint loop of a FOR in gradient/adjoint.py, written by gradient/writer.py's builder
(which the derivative rules receive); gradient/dependence.py finds the values that depend
on X, gradient/checks.py refuses the gradients a loop around makes wrong, and
gradient/labels.py names the backward's values after the forward's.
"""

from sx2torch.gradient.expansion import run
