"""The causal mask of ``causal-attention`` (LANGUAGE.md 5, 6.8) and the sliding window of
``attention``."""

import torch
from torch import Tensor

__all__ = ["causal_mask", "mask_as", "restrict_mask", "window_mask"]


def causal_mask(scores: Tensor, fill: float = float("-inf")) -> Tensor:
    """``scores`` with every entry above the diagonal of its last two axes set to ``fill``.

    Row ``i`` (a query) keeps columns ``j <= i`` (the keys up to it). The mask is
    aligned top-left, as ``F.scaled_dot_product_attention(..., is_causal=True)``
    aligns it, so a row of a wider-than-tall block still keeps its own column.
    The default -inf gives those entries zero weight in a softmax; ``fill=0.0``
    is the mask's gradient. The mask is built from the shape on the scores'
    device, with no Python branch on values, so ``torch.compile(fullgraph=True)``
    traces it whole.
    """
    rows, cols = scores.shape[-2], scores.shape[-1]
    above = torch.ones(rows, cols, dtype=torch.bool, device=scores.device).triu(1)
    return scores.masked_fill(above, fill)


def window_mask(size: int, window: int, device=None) -> Tensor:
    """``[size, size]`` booleans, True where query ``i`` may see key ``j``: ``i - window <= j <= i``.

    flash-attn's ``causal=True, window_size=(window, 0)`` on equal query and key
    lengths, as an ``attn_mask`` for ``F.scaled_dot_product_attention``. The size
    is the sequence length when the module runs; the mask is built from it with
    no Python branch on values, so ``torch.compile(fullgraph=True)`` traces it.
    """
    position = torch.arange(size, device=device)
    distance = position[:, None] - position[None, :]
    return (distance >= 0) & (distance <= window)


def restrict_mask(mask: Tensor, allowed: Tensor) -> Tensor:
    """An ``attn_mask`` (booleans, True where a key is seen, or floats added to the scores)
    restricted to the keys ``allowed`` sees (booleans ``[T, S]``): a padding mask made
    causal, as ``is_causal=True`` cannot go with an ``attn_mask``. The choice is by dtype,
    known when torch.compile traces it, never by values."""
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


def mask_as(mask: Tensor, cast) -> Tensor:
    """An ``attn_mask`` a caller passed, read in the dtype attention computes in: a float
    mask (added to the scores) converted by ``cast`` (a dtype, or the held targets'
    ``round_to_bf16`` or ``as_f32``), a boolean one (True where a key is seen) as it is,
    since a boolean cast to a float becomes an additive 0/1 mask. The choice is by dtype,
    known when torch.compile traces it."""
    if not mask.is_floating_point():
        return mask
    return mask.to(cast) if isinstance(cast, torch.dtype) else cast(mask)
