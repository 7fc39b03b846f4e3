"""`generate`: decoding with the KV cache of a module compiled for a `:generate true` run,
transformers' `generate` loop step for step (its names, its order: the prompt in one forward,
then one token per forward; the last position's logits in f32; the processors of
`sx2torch.runtime.sampling`; finished rows padded with the end token).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from sx2torch.runtime.cache import Cache, generating
from sx2torch.runtime.sampling import next_tokens

__all__ = ["generate"]


def generate(
    model,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
    attention_mask: Optional[Tensor] = None,
    static_cache: bool = False,
    eos_token_id=None,
    streamer=None,
    return_logits: bool = False,
):
    """The prompt `input_ids` [batch, length] followed by up to `max_new_tokens` tokens, as
    transformers' `sequences`; with `return_logits`, `(tokens, logits)`, the logits one f32
    `[batch, vocab]` tensor per step (transformers' `output_logits`).

    `model` is a module compiled from a source with `(defrun NAME ... :generate true)`: its
    forward takes the token ids and gives logits `[batch, length, vocab]`. `static_cache`
    preallocates the cache for the prompt and the new tokens and runs each step after the
    first under `torch.compile(fullgraph=True)`, the same graph at every length.
    `attention_mask` [batch, length] (1 for a token, 0 for padding) takes prompts of different
    lengths padded on the left: each row's positions count its own tokens, as transformers
    computes them, and no query sees a pad. `eos_token_id` (an int or a list) ends a row at one of them; later tokens of a finished
    row are the first of them, transformers' pad. `streamer` is given the prompt, each new
    token (`put`) and the end (`end`), transformers' streamer protocol.
    """
    if input_ids.dim() != 2:
        raise ValueError(
            f"input_ids must be [batch, length], got {tuple(input_ids.shape)}"
        )
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    padded = attention_mask is not None and not bool(attention_mask.all())
    if padded and static_cache:
        raise NotImplementedError("left-padded prompts take the dynamic cache for now")
    ends = _ends(eos_token_id, input_ids.device)
    sample = dict(
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        generator=generator,
    )
    batch, length = input_ids.shape
    # the last token's keys are never read: transformers' static capacity
    cache = Cache(length + max_new_tokens - 1 if static_cache else None)
    if padded:  # transformers' positions: each row counts its own tokens
        cache.keep = attention_mask.bool()
        cache.rows = attention_mask.long().cumsum(-1) - 1
        cache.rows.masked_fill_(attention_mask == 0, 1)
    step = torch.compile(model, fullgraph=True) if static_cache else model
    unfinished = torch.ones(batch, dtype=torch.long, device=input_ids.device)
    tokens, logits = input_ids, []
    if streamer is not None:
        streamer.put(input_ids.cpu())
    with torch.no_grad(), generating(cache):
        chunk, forward = input_ids, model  # the prompt runs eagerly, at its own length
        position = torch.arange(length, device=input_ids.device)
        for _ in range(max_new_tokens):
            cache.begin(tokens.shape[1] - chunk.shape[1], position)
            out = forward(chunk)
            if not cache.keys:
                raise TypeError(
                    "the model keeps no KV cache: compile it from a source with "
                    "(defrun NAME ... :generate true)"
                )
            last = out[:, -1].to(copy=True, dtype=torch.float32)
            logits.append(last)
            chosen = next_tokens(last, **sample)
            if ends is not None:
                chosen = chosen * unfinished + ends[0] * (1 - unfinished)
            tokens = torch.cat([tokens, chosen[:, None]], dim=-1)
            if streamer is not None:
                streamer.put(chosen.cpu())
            if ends is not None:
                unfinished = unfinished & ~torch.isin(chosen, ends)
                if unfinished.max() == 0:
                    break
            chunk, forward = chosen[:, None], step
            if padded:
                cache.rows = cache.rows[:, -1:] + 1
                cache.keep = torch.cat([cache.keep, cache.keep.new_ones(batch, 1)], -1)
            position = _decode_position(cache, position, tokens.shape[1] - 1)
    if streamer is not None:
        streamer.end()
    return (tokens, tuple(logits)) if return_logits else tokens


def _decode_position(cache: Cache, position: Tensor, at: int) -> Tensor:
    """The one-token chunk's position: in a static cache one tensor, written in place, so
    that the compiled step reads the same input at every step."""
    if cache.capacity is None:
        return position
    if position.numel() != 1:
        position = torch.zeros(1, dtype=torch.long, device=position.device)
        torch._dynamo.mark_static_address(position)
    position.fill_(at)
    return position


def _ends(eos_token_id, device) -> Optional[Tensor]:
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.long, device=device)
