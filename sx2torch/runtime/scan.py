"""Linear recurrences as log-depth parallel scans: ``linear-scan`` and ``matrix-scan``.

Both compute ``h_t = A_t h_{t-1} + b_t`` along one axis with ``h_{-1} = 0``.
One step is the affine map ``h -> A h + b``; doing ``(A1, b1)`` and then
``(A2, b2)`` is the affine map ``(A2 A1, A2 b1 + b2)``. The Hillis-Steele scan
composes, at offsets 1, 2, 4, ..., every step with the one ``offset`` before
it; after the round with offset ``k``, position ``t`` holds the composition of
steps ``t - 2k + 1 .. t`` (steps before 0 are the identity map), so after
``ceil(log2 T)`` rounds its ``b`` is ``h_t``.

Each round is a handful of whole-tensor ops (shift, multiply, add), so the
functions are readable, differentiable by autograd, and traced by
``torch.compile(fullgraph=True)`` as a fixed, unrolled sequence of ops (the
number of rounds depends only on the length of the axis). Work is
``O(T log T)`` against the sequential loop's ``O(T)``, in ``log T`` steps of
depth instead of ``T``.

On a CPU, eagerly, where a step holds enough elements that the loop's ``O(T)``
work outweighs its two ops per step, ``linear_scan`` runs the loop instead
(``_sequential``): several times faster on Mamba's shapes, and rounded as the
recurrence is written, which is the bits of a model file's own loop.

The compiler calls them inside an f32 island (LANGUAGE.md 6.8): the products of
many decays lose precision fast in bf16.
"""

import torch
from torch import Tensor

__all__ = [
    "linear_scan",
    "linear_scan_adjoint",
    "matrix_scan",
    "matrix_scan_adjoint",
    "previous",
]


def linear_scan(a: Tensor, b: Tensor, dim: int = 1) -> Tensor:
    """``h_t = a_t * h_{t-1} + b_t`` along ``dim``, with ``h_{-1} = 0``.

    ``a`` and ``b`` broadcast against each other (a gate ``[batch, time, 1]``
    may scale a ``[batch, time, d]`` input); the result has their broadcast
    shape. A length-0 or length-1 axis returns ``b`` (broadcast) unchanged.
    """
    a, b = torch.broadcast_tensors(a, b)
    if _sequential(b, dim):
        return _linear_loop(a, b, dim)
    offset = 1
    while offset < _longest(b.shape[dim]):
        b = b + a * _shift(b, offset, dim, b.new_zeros(()))
        a = a * _shift(a, offset, dim, a.new_ones(()))
        offset *= 2
    return b


def matrix_scan(a: Tensor, b: Tensor, dim: int = 1) -> Tensor:
    """``h_t = A_t @ h_{t-1} + b_t`` along ``dim``, with ``h_{-1} = 0``.

    Shapes: ``a`` is ``[*batch_a, n, n]`` (a matrix per step) and ``b`` is
    ``[*batch_b, n]`` (a vector per step); ``batch_a`` and ``batch_b``
    broadcast to ``batch``, and the result is ``[*batch, n]``. ``dim`` indexes
    ``batch``, the axes the two share: for ``b`` of shape ``[B, T, n]``, ``dim=1``
    is time; a negative ``dim`` counts back from the last batch axis (``-1`` is
    time there too), never the matrix or vector axes. A time-invariant ``A``
    can be passed once, ``[n, n]``.
    """
    n = b.shape[-1]
    if a.dim() < 2 or a.shape[-2:] != (n, n):
        raise ValueError(
            f"matrix_scan: a must be [..., {n}, {n}] for b [..., {n}], got {tuple(a.shape)}"
        )
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-1])
    if not -len(batch) <= dim < len(batch):
        raise ValueError(
            f"matrix_scan: dim {dim} is not one of the {len(batch)} batch axes of {tuple(batch)}"
        )
    dim = dim % len(batch)
    a = a.expand(*batch, n, n)
    b = b.expand(*batch, n)
    identity = torch.eye(n, dtype=a.dtype, device=a.device)
    offset = 1
    while offset < _longest(b.shape[dim]):
        earlier = _shift(b, offset, dim, b.new_zeros(()))
        b = b + (a @ earlier.unsqueeze(-1)).squeeze(-1)
        a = a @ _shift(a, offset, dim, identity)
        offset *= 2
    return b


# A CPU op's fixed cost in elements of a whole-tensor pass, as the rule below uses it: the
# loop runs two ops a step, the scan about seven a round over all T steps, so the loop wins
# once a step's elements times the rounds pass it. `python -m benchmarks.scan --crossover`
# measures where (one thread): on this project's 2-core machine the crossover moved by 2.5x
# with the load, and 8,000 lies between (at T = 64, 512, 2048 the loop from 1,300, 900 and
# 700 elements a step).
_OP_COST_IN_ELEMENTS = 8_000


def _sequential(b: Tensor, dim: int) -> bool:
    """Whether the recurrence is cheaper as the plain loop than as the scan: on the CPU,
    eagerly, where a step's elements times the scan's rounds outweigh an op's fixed cost.
    ``torch.compile`` and ``torch.export`` keep the scan, whose graph does not grow with
    the length; a GPU keeps it too, where the loop's ops each cost a launch."""
    length = b.shape[dim]
    if b.device.type != "cpu" or torch.compiler.is_compiling() or length < 2:
        return False
    rounds = (length - 1).bit_length()
    return b.numel() // length * rounds >= _OP_COST_IN_ELEMENTS


def _linear_loop(a: Tensor, b: Tensor, dim: int) -> Tensor:
    """``h_t = a_t * h_{t-1} + b_t`` one step at a time, rounded as written: the bits of the
    loop a model file writes (transformers' Mamba slow path), and of the interpreter's.
    """
    h, states = b.new_zeros(()), []
    for a_t, b_t in zip(a.unbind(dim), b.unbind(dim)):
        h = a_t * h + b_t
        states.append(h)
    return torch.stack(states, dim)


def _longest(length) -> int:
    """The length a scan's rounds are counted for: the axis's own, or, where it is symbolic
    (``torch.export`` with a dynamic sequence length), the most it may be, so that the
    rounds do not depend on it (a round whose offset reaches past the axis changes
    nothing)."""
    if not isinstance(length, torch.SymInt):
        return length
    from torch.fx.experimental.symbolic_shapes import bound_sympy

    upper = bound_sympy(length.node.expr, length.node.shape_env.var_to_range).upper
    if not upper.is_Integer:  # int_oo
        raise ValueError(
            "a scan over a dynamic length needs its most: declare one, as "
            "torch.export.Dim('T', max=4096)"
        )
    return int(upper)


def _shift(x: Tensor, offset: int, dim: int, fill: Tensor) -> Tensor:
    """``x`` moved ``offset`` steps later along ``dim``; the first ``offset`` steps are
    ``fill`` (all of them, where ``offset`` reaches past the axis): ``offset`` fills put
    before ``x`` and the axis's length kept, which reads no difference of lengths that a
    symbolic one would have to be guarded for."""
    shape = list(x.shape)
    shape[dim] = offset
    return torch.cat([fill.expand(shape), x], dim).narrow(dim, 0, x.shape[dim])


def previous(h: Tensor, dim: int = 1) -> Tensor:
    """``h_{t-1}`` along ``dim``, with ``h_{-1} = 0``: what step ``t`` of a scan read."""
    if h.shape[dim] == 0:
        return h
    return _shift(h, 1, dim, h.new_zeros(()))


def linear_scan_adjoint(a: Tensor, grad: Tensor, dim: int = 1) -> Tensor:
    """The gradient of a linear scan's ``b``: ``l_t = g_t + a_{t+1} l_{t+1}``, a scan run backwards.

    The gradient of its ``a`` is then ``l_t * h_{t-1}``.
    """
    a = a.expand_as(grad)
    later = _unshift(a, dim, a.new_zeros(()))
    return linear_scan(later.flip(dim), grad.flip(dim), dim).flip(dim)


def matrix_scan_adjoint(a: Tensor, grad: Tensor, dim: int = 1) -> Tensor:
    """The gradient of a matrix scan's ``b``: ``l_t = g_t + A_{t+1}^T l_{t+1}``.

    ``dim`` is counted as in ``matrix_scan``; the gradient of ``A_t`` is the
    outer product ``l_t h_{t-1}^T``.
    """
    n = grad.shape[-1]
    batch = grad.shape[:-1]
    dim = dim % len(batch)
    a = a.expand(*batch, n, n).transpose(-1, -2)
    later = _unshift(a, dim, a.new_zeros(()))
    return matrix_scan(later.flip(dim), grad.flip(dim), dim).flip(dim)


def _unshift(x: Tensor, dim: int, fill: Tensor) -> Tensor:
    """``x`` moved one step earlier along ``dim``; the last step is ``fill``."""
    if x.shape[dim] == 0:
        return x
    tail = fill.expand_as(x.narrow(dim, 0, 1))
    return torch.cat([x.narrow(dim, 1, x.shape[dim] - 1), tail], dim)
