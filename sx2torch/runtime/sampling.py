"""The choice of the next token from the last position's logits, as transformers' generate
makes it. This holds the greedy case only; sampling (temperature, top-k, top-p in
transformers' order) comes with the sampling branch."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["next_tokens"]


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
    greedy, transformers' `argmax`."""
    if do_sample:
        raise NotImplementedError("do_sample=True: sampling is not implemented yet")
    return torch.argmax(logits, dim=-1)
