"""`generate`: decoding with the KV cache of a module compiled for a `:generate true` run,
transformers' `generate` loop step for step (its names, its order: the prompt in one forward,
then one token per forward; the last position's logits in f32; the processors of
`sx2torch.runtime.sampling`; finished rows padded with the end token).
"""

from __future__ import annotations

import functools
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
    decoder_start_token_id: Optional[int] = None,
):
    """The prompt `input_ids` [batch, length] and up to `max_new_tokens` tokens after it,
    transformers' `sequences`; with `return_logits`, `(tokens, logits)`, one f32 `[batch,
    vocab]` tensor per step (`output_logits`). `model` is compiled from a source with
    `(defrun NAME ... :generate true)`. `static_cache` preallocates the cache and compiles
    the steps after the prompt (fullgraph, one graph; on a GPU a CUDA graph). `attention_mask` (1 a token, 0 a pad)
    takes prompts padded on the left, positions counted per row as transformers does.
    `eos_token_id` (an int or a list) ends a row, padded after with the first of them;
    `streamer` gets the prompt, each token (`put`) and the end (`end`).

    An encoder-decoder (compiled from `(defrun NAME ... :generate decoder-input-ids)`,
    forward taking the prompt and then the decoder's ids) is given `decoder_start_token_id`:
    `input_ids` is then the encoder's prompt, run once (T5's ids, Whisper's features), and
    the tokens are the decoder's, that token first, as transformers' `sequences` of an
    encoder-decoder.
    """
    if decoder_start_token_id is not None:
        _one_length(static_cache, attention_mask)
        model, input_ids = _with_prompt(model, input_ids, decoder_start_token_id)
    cache = _new_cache(input_ids, max_new_tokens, attention_mask, static_cache)
    sample = dict(
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        generator=generator,
    )
    step = _compiled_step(model, input_ids.device) if static_cache else model
    if streamer is not None:
        streamer.put(input_ids.cpu())
    ends = _ends(eos_token_id, input_ids.device)
    with torch.no_grad(), generating(cache):
        tokens, logits = _decode(
            (model, step), input_ids, cache, max_new_tokens, sample, ends, streamer
        )
    if streamer is not None:
        streamer.end()
    return (tokens, tuple(logits)) if return_logits else tokens


def _decode(forwards, input_ids, cache, max_new_tokens, sample, ends, streamer):
    """(the tokens, the logits of each step): the prompt's forward eager, at its own
    length, then each token's by `forwards`' second (compiled for a static cache)."""
    unfinished = None if ends is None else torch.ones_like(input_ids[:, 0])
    tokens, logits = input_ids, []
    chunk, (forward, step) = input_ids, forwards
    position = torch.arange(input_ids.shape[1], device=input_ids.device)
    for _ in range(max_new_tokens):
        cache.begin(tokens.shape[1] - chunk.shape[1], position)
        logits.append(_last_logits(forward(chunk), cache))
        chosen = next_tokens(logits[-1], **sample)
        if ends is not None:  # a finished row is padded with the first end token
            chosen = chosen * unfinished + ends[0] * (1 - unfinished)
            unfinished = unfinished & ~torch.isin(chosen, ends)
        tokens = torch.cat([tokens, chosen[:, None]], dim=-1)
        if streamer is not None:
            streamer.put(chosen.cpu())
        if unfinished is not None and unfinished.max() == 0:
            break
        chunk, forward = chosen[:, None], step
        position = _advance(cache, position, tokens.shape[1] - 1)
    return tokens, logits


def _with_prompt(model, prompt: Tensor, start: int) -> tuple:
    """An encoder-decoder's forward given its prompt, any tensor whose first axis is the
    batch (Whisper's input_features [batch, mel bins, frames]), and the decoder's first
    tokens: `start` in each row, [batch, 1] int64, transformers' decoder_input_ids."""
    starts = torch.full((len(prompt), 1), start, dtype=torch.long, device=prompt.device)
    return functools.partial(model, prompt), starts


def _one_length(static_cache: bool, attention_mask) -> None:
    if static_cache or attention_mask is not None:
        raise ValueError(
            "an encoder-decoder generates with a dynamic cache and prompts of one "
            "length: give neither static_cache nor attention_mask"
        )


def _compiled_step(model, device: torch.device):
    """The decode step compiled whole; on a GPU replayed as a CUDA graph, as transformers'
    static generate does there: a step at this size is mostly kernel launches."""
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    return torch.compile(model, fullgraph=True, mode=mode)


def _last_logits(out: Tensor, cache: Cache) -> Tensor:
    """The last position's logits in f32, transformers' `output_logits`."""
    if not cache.keys and not cache.states and not cache.kept:
        raise TypeError(
            "the model keeps no cache: compile it from a source with "
            "(defrun NAME ... :generate true)"
        )
    return out[:, -1].to(copy=True, dtype=torch.float32)


def _new_cache(
    input_ids: Tensor, max_new_tokens: int, attention_mask, static_cache: bool
) -> Cache:
    if input_ids.dim() != 2:
        raise ValueError(
            f"input_ids must be [batch, length], got {tuple(input_ids.shape)}"
        )
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    padded = attention_mask is not None and not bool(attention_mask.all())
    # the last token's keys are never read: transformers' static capacity
    cache = Cache(input_ids.shape[1] + max_new_tokens - 1 if static_cache else None)
    if padded:  # transformers' positions: each row counts its own tokens
        cache.keep = attention_mask.bool()
        if static_cache:  # every key to come is a token; the causal mask hides them
            cache.keep = torch.ones(
                len(input_ids),
                cache.capacity,
                dtype=torch.bool,
                device=input_ids.device,
            )
            cache.keep[:, : input_ids.shape[1]] = attention_mask.bool()
        cache.rows = attention_mask.long().cumsum(-1) - 1
        cache.rows.masked_fill_(attention_mask == 0, 1)
    return cache


def _advance(cache: Cache, position: Tensor, at: int) -> Tensor:
    """After a token, the next one-token chunk: a padded row's next position and key; in
    a static cache the position is one tensor, written in place, so that the compiled step
    reads the same input at every step."""
    if cache.rows is not None and cache.capacity is None:
        cache.rows = cache.rows[:, -1:] + 1
        cache.keep = torch.cat(
            [cache.keep, cache.keep.new_ones(len(cache.keep), 1)], -1
        )
    if cache.capacity is None:
        return position
    if cache.rows is not None:  # one [B, 1] tensor from the first step on, as position
        if cache.rows.shape[1] != 1:
            cache.rows = cache.rows[:, -1:].clone()
            torch._dynamo.mark_static_address(cache.rows)
        cache.rows.add_(1)
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
