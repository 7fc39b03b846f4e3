"""The choice of the next token from the last position's logits, as transformers' generate
makes it: greedy is its `argmax`; sampling applies its processors in its order (temperature,
top-k, top-p, each with its arithmetic, its filter value -inf and one token kept at least)
and draws with `torch.multinomial(probs, 1)`, so that a generator seeded as transformers'
global one gives the same tokens.

transformers' `_sample` draws from the global generator; `generator=None` does the same, and a
`torch.Generator` seeded with S draws what `torch.manual_seed(S)` followed by transformers'
generate draws. One difference in the defaults: `top_k=None` here filters nothing, where
transformers' generate fills an unset `top_k` with 50.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["check_settings", "next_tokens", "sampling_scores"]

FILTERED = -float("inf")  # transformers' filter_value for top-k and top-p
MIN_TOKENS_TO_KEEP = 1  # transformers' for a generate without beams


def next_tokens(
    logits: Tensor,
    *,
    do_sample: bool,
    temperature: float,
    top_k: Optional[int],
    top_p: Optional[float],
    generator: Optional[torch.Generator],
) -> Tensor:
    """The next token of each row, `[batch]` int64, from f32 logits `[batch, vocab]`:
    transformers' `argmax`, or with `do_sample` its draw from the processed scores."""
    if not do_sample:
        return torch.argmax(logits, dim=-1)
    scores = sampling_scores(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    probs = torch.nn.functional.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def sampling_scores(
    logits: Tensor,
    *,
    temperature: float,
    top_k: Optional[int],
    top_p: Optional[float],
) -> Tensor:
    """The scores transformers' sampling processors make of `logits` [batch, vocab]: each
    processor applies only where it changes something, as transformers builds its list
    (temperature 1.0, top-k None or 0 and top-p None or 1.0 are left out)."""
    check_settings(temperature, top_k, top_p)
    scores = logits
    if temperature != 1.0:
        scores = scores / temperature
    if top_k is not None and top_k != 0:
        k = min(max(top_k, MIN_TOKENS_TO_KEEP), scores.size(-1))
        # every token below the k-th largest score
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, FILTERED)
    if top_p is not None and top_p < 1.0:
        scores = _top_p(scores, top_p)
    return scores


def _top_p(scores: Tensor, top_p: float) -> Tensor:
    """transformers' TopPLogitsWarper: the tokens whose cumulative probability, summed from
    the least likely up, stays at or below 1 - top_p are removed, never the most likely.
    """
    ascending, order = torch.sort(scores, descending=False)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -MIN_TOKENS_TO_KEEP:] = 0
    remove = remove.scatter(1, order, remove)
    return scores.masked_fill(remove, FILTERED)


def check_settings(temperature, top_k, top_p) -> None:
    """transformers' refusals of these settings, said in the driver's names: a ValueError or
    TypeError."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number, got {temperature!r}")
    if not temperature > 0:
        raise ValueError(
            f"temperature must be greater than 0, got {temperature} "
            "(greedy decoding is do_sample=False)"
        )
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0
    ):
        raise ValueError(f"top_k must be an integer >= 0 or None, got {top_k!r}")
    if top_p is not None and not 0.0 <= float(top_p) <= 1.0:
        raise ValueError(f"top_p must be between 0 and 1, got {top_p!r}")
