"""The causal mask of ``causal-attention`` (LANGUAGE.md 5, 6.8), the sliding window of
``attention``, and ``attention`` with a score soft-cap (Gemma 2's), which has no SDPA form.
"""

from typing import Callable, Optional

import torch
from torch import Tensor

__all__ = [
    "causal_mask",
    "eager_attention",
    "mask_as",
    "restrict_mask",
    "seen",
    "softcapped",
    "window_mask",
]


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


def seen(query_at: Tensor, key_at: Tensor, window=None) -> Tensor:
    """``[S, L]`` booleans: query i, at position ``query_at[i]``, sees the key at
    ``key_at[j]`` where ``key_at[j] <= query_at[i]``, and ``>= query_at[i] - window`` where
    there is a window."""
    allowed = key_at[None, :] <= query_at[:, None]
    if window is not None:
        allowed = allowed & (key_at[None, :] >= query_at[:, None] - window)
    return allowed


def eager_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor] = None,
    *,
    softcap,
    scale=None,
    causal: bool = False,
    window=None,
    enable_gqa: bool = False,
    round: Optional[Callable] = None,
) -> Tensor:
    """``(attention q k v :softcap C ...)``: the keys each query sees (``causal``, top-left
    aligned, ``window`` as ``window_mask``'s, ``mask`` booleans or added to the scores as
    SDPA takes it), then ``softcapped``."""
    allowed = None
    if causal or window is not None:
        at = torch.arange(q.shape[-2], device=q.device)
        allowed = seen(at, torch.arange(k.shape[-2], device=q.device), window)
    added = None
    if mask is not None and mask.dtype == torch.bool:
        allowed = mask if allowed is None else allowed & mask
    else:
        added = mask
    return softcapped(q, k, v, allowed, softcap, scale, enable_gqa, round, added)


def softcapped(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Optional[Tensor],
    softcap,
    scale=None,
    enable_gqa: bool = False,
    round: Optional[Callable] = None,
    added: Optional[Tensor] = None,
) -> Tensor:
    """transformers' ``eager_attention_forward`` (Gemma 2's), op for op in the dtype q, k
    and v come in: K and V repeated for each group of query heads (``repeat_kv``), the
    scores ``q @ kᵀ`` rounded, scaled (rounded), soft-capped ``tanh(s / C) * C`` (each step
    rounded), the keys not ``allowed`` set to -inf (its mask adds the dtype's least value,
    the same weights after the softmax), the softmax in f32 rounded to the dtype, times V.
    ``round``, on the targets that hold bf16 in f32 tensors (``sx.round_to_bf16``), rounds
    where the bf16 kernels round."""
    kept = round or (lambda x: x)
    groups = q.shape[-3] // k.shape[-3]
    if enable_gqa and groups > 1:
        k = k.repeat_interleave(groups, dim=-3)
        v = v.repeat_interleave(groups, dim=-3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = kept(kept(q @ k.transpose(-1, -2)) * scale)
    scores = kept(kept(torch.tanh(kept(scores / softcap))) * softcap)
    if added is not None:
        scores = kept(scores + added.to(scores.dtype))
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = kept(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype))
    return kept(weights @ v)
