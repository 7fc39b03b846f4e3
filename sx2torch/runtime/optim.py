"""``newton-schulz`` of sexpgpu/optim: Muon's quintic orthogonalization (LANGUAGE.md 5, 6.8)."""

import torch
from torch import Tensor

from sx2torch.runtime.rounding import round_to_bf16

__all__ = ["newton_schulz"]

# Muon's coefficients: they push every singular value of the normalized matrix
# into roughly [0.7, 1.2] in a few steps, rather than converging to exactly 1.
COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(g: Tensor, steps: int = 5, held: bool = False) -> Tensor:
    """An approximately orthogonal matrix with ``g``'s singular vectors, in ``g``'s dtype.

    ``g`` is ``[..., rows, cols]`` (a batch of matrices). The iteration runs in
    bf16 whatever ``g``'s dtype, with explicit casts: ``X = G / (||G||_F + 1e-7)``
    (the norm of each matrix), transposed when it has more rows than columns
    so that ``X Xᵀ`` is the smaller Gram matrix; then ``steps`` times
    ``A = X Xᵀ; B = b A + c A A; X = a X + B X``; then transposed back. The
    result is cast back to ``g``'s dtype: the compiler passes bf16 inside a bf16
    region and casts the result up to f32 outside it.

    With ``held=True`` (the metal and cpu targets) the same iteration runs on
    bf16 values held in f32 tensors, each op computed in f32 and rounded on
    store, as a bf16 op computes: no bf16 tensor is made, and the result is f32.
    """
    if g.dim() < 2:
        raise ValueError(f"newton_schulz needs a matrix, got shape {tuple(g.shape)}")
    a, b, c = COEFFICIENTS
    store = round_to_bf16 if held else _unchanged
    x = store(g.float()) if held else g.to(torch.bfloat16)
    tall = g.shape[-2] > g.shape[-1]
    if tall:
        x = x.mT
    x = store(x / store(store(x.norm(dim=(-2, -1), keepdim=True)) + 1e-7))
    for _ in range(steps):
        gram = store(x @ x.mT)
        poly = store(store(b * gram) + store(store(c * gram) @ gram))
        x = store(store(a * x) + store(poly @ x))
    if tall:
        x = x.mT
    return x if held else x.to(g.dtype)


def _unchanged(x: Tensor) -> Tensor:
    """Native bf16 ops round on store by themselves."""
    return x
