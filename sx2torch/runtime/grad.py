"""Backward helpers the emitted code of `gradient` calls where one torch call would not do.

Each is written with differentiable torch ops, so `loss.backward()` can differentiate the
emitted backward (double backward)."""

from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F


def take_backward(
    grad: torch.Tensor,
    table: torch.Tensor,
    ids: torch.Tensor,
    padding_idx: Optional[int] = None,
) -> torch.Tensor:
    """The gradient of `table[ids]` with respect to `table`: rows scattered back and summed;
    with a padding_idx, F.embedding's: that row's gradient zero."""
    rows = grad.reshape(-1, *table.shape[1:])
    summed = grad.new_zeros(table.shape).index_add(0, ids.reshape(-1), rows)
    if padding_idx is not None:
        summed[padding_idx] = 0
    return summed


def slice_backward(
    grad: torch.Tensor, x: torch.Tensor, dim: int, start: int, end, step: int = 1
) -> torch.Tensor:
    """The gradient of a slice of `x` along `dim`: zeros around the slice's gradient (and,
    with a step, between its elements)."""
    if step != 1:
        zeros = grad.new_zeros(x.shape)
        return zeros.slice_scatter(grad, dim, start, end, step)
    size = x.shape[dim]
    start, stop, _ = slice(start, end).indices(size)
    before = list(grad.shape)
    before[dim] = start
    after = list(grad.shape)
    after[dim] = size - max(stop, start)
    return torch.cat([grad.new_zeros(before), grad, grad.new_zeros(after)], dim=dim)


def concat_part(grad: torch.Tensor, parts: list, index: int, dim: int) -> torch.Tensor:
    """The gradient of `torch.cat(parts, dim)` with respect to `parts[index]`."""
    return torch.split(grad, [p.shape[dim] for p in parts], dim=dim)[index]


def cross_entropy_backward(
    grad: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor,
    reduction: str = "mean",
) -> torch.Tensor:
    """The gradient of the cross-entropy over rows with respect to the logits: of their
    mean (the default), their sum, or (`"none"`) each row's loss, `grad` one per row."""
    classes = torch.nn.functional.one_hot(labels, logits.shape[-1]).to(logits.dtype)
    if reduction == "mean":
        grad = grad / labels.numel()
    elif reduction == "none":
        grad = grad.unsqueeze(-1)
    return (torch.softmax(logits, dim=-1) - classes) * grad


def rms_norm_backward(
    grad: torch.Tensor, x: torch.Tensor, weight=None, eps: float = 2.0**-23
) -> torch.Tensor:
    """The gradient of `F.rms_norm(x, (x.size(-1),), weight, eps)` with respect to `x`, as
    its kernel's backward gives it: f32 inside, rounded once to `grad`'s dtype."""
    normed, inverse_rms = _rms_normed(x, eps)
    u = grad.float() if weight is None else grad.float() * weight.float()
    along = (u * normed).mean(-1, keepdim=True)
    return (inverse_rms * (u - normed * along)).to(grad.dtype)


def rms_norm_weight_backward(
    grad: torch.Tensor, x: torch.Tensor, eps: float = 2.0**-23
) -> torch.Tensor:
    """The gradient of `F.rms_norm(x, (x.size(-1),), weight, eps)` with respect to
    `weight`: the sum of `grad` times the normed `x` over every axis but the last, f32
    inside, rounded once to `grad`'s dtype."""
    normed, _ = _rms_normed(x, eps)
    rows = (grad.float() * normed).reshape(-1, x.shape[-1])
    return rows.sum(0).to(grad.dtype)


def _rms_normed(x: torch.Tensor, eps: float) -> tuple:
    wide = x.float()
    inverse_rms = torch.rsqrt(wide.square().mean(-1, keepdim=True) + eps)
    return wide * inverse_rms, inverse_rms


def group_norm_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    groups: int,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    part: int = 0,
) -> torch.Tensor:
    """The gradient of `F.group_norm(x, groups, weight, bias, eps)` with respect to `x`
    (part 0), `weight` (1) or `bias` (2), as torch.autograd gives it with its graph kept:
    torch's differentiable form of the backward (its kernel's has no derivative), so this
    can be differentiated again."""
    with torch.enable_grad():
        x_, weight_ = (
            t if t is None or t.requires_grad else t.detach().requires_grad_()
            for t in (x, weight)
        )
        bias = x.new_zeros(x.shape[1]).requires_grad_() if part == 2 else None
        out = F.group_norm(x_, groups, weight_, bias, eps)
        # contiguous, as torch's native backward reads it (`grad.contiguous()`): the
        # differentiable backward's sums add in the order of the gradient's layout
        (made,) = torch.autograd.grad(
            out, [(x_, weight_, bias)[part]], grad.contiguous(), create_graph=True
        )
    keeps = any(t is not None and t.requires_grad for t in (grad, x, weight))
    return made if keeps and torch.is_grad_enabled() else made.detach()
