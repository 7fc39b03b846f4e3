"""The KV cache of a module compiled for a `(defrun NAME :generate true)` run.

The compiler's `cache` pass makes each causal `attention` a `cached-attention`, each `conv1d`
and `linear-scan` along the sequence a `cached-conv1d` and a `cached-linear-scan` (a recurrent
state: a convolution's last inputs, a scan's last value, in `Cache.states`), each position over
the sequence axis a `cache-positions`, and the value the last of them feeds a `last-position`;
they are written as the functions below. Without a generation running
(`sx2torch.runtime.generate` makes one with `generating`), each computes what the plain op
computes, so the module trains and evaluates as before. While one runs, the i-th attention
called in a forward keeps its keys and values in the cache's slot i, positions start where the
cache ends, and tokenwise work after the last attention reads the last position only.

A store is a copy, never a rounding: keys, values and states reach the cache in the dtype the
op reads them in, the `dtype` the compiler writes as a literal beside each call (checked here).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import torch
from torch import Tensor
from torch.nn import functional as F

from sx2torch.runtime.attention import (
    causal_mask,
    eager_attention,
    seen,
    softcapped,
    window_mask,
)
from sx2torch.runtime.scan import linear_scan

__all__ = [
    "Cache",
    "cached_attention",
    "cached_causal_mask",
    "cached_conv1d",
    "cached_linear_scan",
    "cached_matmul",
    "cache_positions",
    "generating",
    "last_position",
    "once",
]

_ACTIVE: list = [None]  # the cache of the generation running, else None


class Cache:
    """Keys and values of every cached attention, slot by slot in the order a forward calls
    them. Dynamic (`capacity` None): each chunk is concatenated, as transformers'
    DynamicCache does. Static: each slot is preallocated `[B, KV, capacity, D]` on its first
    store and written in place at `position` (a tensor, so that a compiled step reads the
    same buffers at every length). Left-padded prompts: `keep` [B, L] says which stored
    keys are tokens (static: [B, capacity], the keys to come counted as tokens), `rows`
    [B, S] is each row's positions of the chunk.

    A slot of a sliding window W holds the last W keys only, as transformers' sliding
    layers do (no later query sees an earlier one): dynamic, the chunk attends over those
    and its own, then the last W are kept; static, the slot holds W + 1 and, once full,
    rolls (StaticSlidingWindowLayer's steps, so that the keys an attention reads are its).
    `starts[i]` is the position of slot i's first key.
    """

    def __init__(self, capacity: Optional[int] = None):
        self.capacity = capacity
        self.keys: list = []
        self.values: list = []
        self.starts: list = []
        self.length = 0  # tokens stored before this chunk (dynamic)
        self.slot = 0  # the next attention's slot in this forward
        self.position: Optional[Tensor] = (
            None  # static: this chunk's positions, int64 [S]
        )
        self.keep: Optional[Tensor] = None  # padded: the keys that are tokens, [B, L]
        self.rows: Optional[Tensor] = None  # padded: the chunk's positions, [B, S]
        # a convolution's last inputs, a scan's last value: one per op a forward calls
        self.states: list = []
        self.state_slot = 0
        # the keys, and the values, of attention written out: one per product that reads them
        self.kept: list = []
        self.kept_slot = 0
        # what the calls of the prompt alone gave (an encoder's output): one per call
        self.prompt: list = []
        self.prompt_slot = 0
        # whether the scores of the attention written out being computed went through its
        # causal mask (a flag of the module may leave the mask out)
        self.masked = False

    def begin(self, length: int, position: Optional[Tensor] = None) -> None:
        """Before each forward: `length` tokens are stored, the chunk comes after them."""
        self.length, self.slot, self.state_slot = length, 0, 0
        self.kept_slot, self.prompt_slot = 0, 0
        if position is not None:
            self.position = position

    def state(self) -> Optional[Tensor]:
        """The next recurrent op's state (None before the prompt's), taking its slot."""
        if self.rows is not None:
            raise ValueError(
                "left-padded prompts cannot start a recurrent state (a convolution's or "
                "scan's along the sequence): give prompts of one length"
            )
        slot, self.state_slot = self.state_slot, self.state_slot + 1
        return self.states[slot] if slot < len(self.states) else None

    def keep_state(self, value: Tensor, dtype: torch.dtype) -> None:
        """Keep the state the op just taken gives the next chunk: a copy, in place in a
        static cache (the compiled step reads the same buffer at every length)."""
        if value.dtype != dtype:
            raise TypeError(f"the cache holds {dtype}, the op gave {value.dtype}")
        slot = self.state_slot - 1
        if slot == len(self.states):
            buffer = value.clone()
            if self.capacity:
                torch._dynamo.mark_static_address(buffer)
            self.states.append(buffer)
        elif self.capacity:
            self.states[slot].copy_(value)
        else:
            self.states[slot] = value.clone()

    def extend(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """The keys (or values) of attention written out that a product reads: those stored,
        then the chunk's `x`, [..., positions, dim]. Dynamic, concatenated as transformers'
        DynamicCache does (the prompt's made contiguous, as its concatenation to an empty
        tensor makes them: the product's bits depend on the layout); static, written in
        place at the chunk's positions, the keys to come zeros that a causal mask hides.
        """
        if x.dtype != dtype:
            raise TypeError(f"the cache holds {dtype}, the product read {x.dtype}")
        if self.keep is not None:
            raise ValueError(
                "left-padded prompts need a mask on the pads, which this model's attention "
                "(written out as matmuls) does not take: give prompts of one length"
            )
        slot, self.kept_slot = self.kept_slot, self.kept_slot + 1
        if slot == len(self.kept):
            if not self.capacity:
                self.kept.append(x.contiguous())
                return self.kept[slot]
            self.kept.append(self._empty(x, self.capacity))
        if self.capacity:
            self.kept[slot].index_copy_(-2, self.position, x)
        else:
            self.kept[slot] = torch.cat([self.kept[slot], x], dim=-2)
        return self.kept[slot]

    def store(self, k: Tensor, v: Tensor, dtype: torch.dtype, window=None) -> tuple:
        """The keys and values this slot attends over, the chunk's among them, and the
        position of the first."""
        if k.dtype != dtype or v.dtype != dtype:
            raise TypeError(
                f"the cache holds {dtype}, the attention gave {k.dtype} and {v.dtype}"
            )
        slot, self.slot = self.slot, self.slot + 1
        held = self.capacity  # static: a window's slot holds W + 1 keys
        if held and window is not None:
            held = min(held, window + 1)
        if slot == len(self.keys):
            self.keys.append(self._empty(k, held) if self.capacity else k)
            self.values.append(self._empty(v, held) if self.capacity else v)
            self.starts.append(0)
            if not self.capacity:
                self._evict(slot, window)
                return k, v, 0
        if self.capacity and held < self.capacity:
            return self._slide(slot, k, v)
        if self.capacity:
            self.keys[slot].index_copy_(-2, self.position, k)
            self.values[slot].index_copy_(-2, self.position, v)
            return self.keys[slot], self.values[slot], 0
        start = self.starts[slot]
        self.keys[slot] = keys = torch.cat([self.keys[slot], k], dim=-2)
        self.values[slot] = values = torch.cat([self.values[slot], v], dim=-2)
        self._evict(slot, window)
        return keys, values, start

    def _evict(self, slot: int, window) -> None:
        """A dynamic slot of a window keeps its last W keys, as DynamicSlidingWindowLayer."""
        held = self.keys[slot].shape[-2]
        if window is not None and held > window:
            self.starts[slot] += held - window
            self.keys[slot] = self.keys[slot][..., -window:, :]
            self.values[slot] = self.values[slot][..., -window:, :]

    def _slide(self, slot: int, k: Tensor, v: Tensor) -> tuple:
        """A static slot of a window, W + 1 keys, transformers' StaticSlidingWindowLayer:
        written in place until full, then rolled for one token; a chunk that fills or
        overflows it attends over all it had and its own, and the last W + 1 are kept.
        """
        keys, values = self.keys[slot], self.values[slot]
        held, length, chunk = keys.shape[-2], self.length, k.shape[-2]
        if chunk == 1:
            return self._slide_one(keys, values, k, v)
        if length + chunk <= held:
            keys.index_copy_(-2, self.position, k)
            values.index_copy_(-2, self.position, v)
            return keys, values, 0
        start = max(length - held + 1, 0)
        before = slice(1, None) if length >= held else slice(0, length)
        full_keys = torch.cat([keys[..., before, :], k], dim=-2)
        full_values = torch.cat([values[..., before, :], v], dim=-2)
        keys.copy_(full_keys[..., -held:, :])
        values.copy_(full_values[..., -held:, :])
        return full_keys, full_values, start

    def _slide_one(self, keys: Tensor, values: Tensor, k: Tensor, v: Tensor) -> tuple:
        """One token (each step the static cache compiles): once the slot is full it rolls
        by one and the token goes last, before that the token goes at its position, as
        StaticSlidingWindowLayer does; both decided on the position tensor, so the compiled
        step reads no Python number that changes from step to step (a branch on the
        length was a guard that compiled the step again at every token)."""
        held = keys.shape[-2]
        full = self.position >= held
        at = self.position.clamp(max=held - 1)
        for buffer, new in ((keys, k), (values, v)):
            moved = torch.where(full, buffer.roll(-1, dims=-2), buffer)
            moved.index_copy_(-2, at, new)
            buffer.copy_(moved)
        return keys, values, (self.position - (held - 1)).clamp(min=0)

    def positions(self, queries: int, start, keys: int, device) -> tuple:
        """The chunk's queries' positions and those of the keys a slot gave from `start`
        (a number, or a one-element tensor in a static slot's step)."""
        key_at = torch.arange(keys, device=device) + start
        if self.capacity:
            return self.position, key_at
        return torch.arange(self.length, self.length + queries, device=device), key_at

    def _empty(self, x: Tensor, capacity: int) -> Tensor:
        shape = (*x.shape[:-2], capacity, x.shape[-1])
        buffer = torch.zeros(shape, dtype=x.dtype, device=x.device)
        # the step compiled once reads the same storage at every length
        torch._dynamo.mark_static_address(buffer)
        return buffer

    def bytes_per_token(self) -> int:
        """What one more token costs the cache, every slot's keys and values."""
        return sum(
            t.element_size() * t[..., 0, :].numel()
            for t in [*self.keys, *self.values, *self.kept]
        )


@contextmanager
def generating(cache: Cache):
    """Run the module's forwards with `cache` as the generation's cache."""
    _ACTIVE[0] = cache
    try:
        yield cache
    finally:
        _ACTIVE[0] = None


def cached_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    dtype: torch.dtype,
    scale=None,
    window=None,
    enable_gqa: bool = False,
    softcap=None,
    round=None,
) -> Tensor:
    """`(attention q k v :causal true ...)` with its keys and values kept in the cache.

    Without a generation running it is the plain op's call. In a dynamic cache the chunk's
    S queries see the L keys stored, theirs last: no mask for one query, `is_causal` when
    nothing was stored before, else the causal mask aligned bottom-right (query i sees keys
    j <= L - S + i), transformers' `sdpa_attention_forward` call in each case. A static
    cache attends over its whole capacity with the boolean mask of the filled keys, and
    grouped-query attention written as transformers' static cache writes it. With a
    `softcap`, transformers' eager attention (`sx.eager_attention`) over the same keys,
    with the boolean mask of those each query sees.
    """
    extra = {} if scale is None else {"scale": scale}
    cache = _ACTIVE[0]
    if cache is None:
        return _plain(q, k, v, scale, window, enable_gqa, softcap, round)
    k, v, start = cache.store(k, v, dtype, window)
    queries, keys = q.shape[-2], k.shape[-2]
    query_at, key_at = cache.positions(queries, start, keys, q.device)
    if softcap is not None:
        mask = seen(query_at, key_at, window)
        if cache.keep is not None:
            mask = mask & cache.keep[:, None, None, key_at]
        return softcapped(q, k, v, mask, softcap, scale, enable_gqa, round)
    if cache.capacity:
        return _static(q, k, v, query_at, key_at, cache.keep, window, extra)
    if cache.keep is not None:
        mask = seen(query_at, key_at, window) & cache.keep[:, None, None, key_at]
        return _masked(q, k, v, mask, extra)
    if window is None and keys == queries:
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=queries > 1, enable_gqa=enable_gqa, **extra
        )
    if window is None and queries == 1:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=enable_gqa, **extra)
    mask = seen(query_at, key_at, window)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=enable_gqa, **extra
    )


def once(function, *args, **keys):
    """`function(*args, **keys)`, a call of the prompt's values alone (an encoder, the keys
    and values of a cross-attention). Without a generation running, the call. While one
    runs, the call of the first forward, made as the plain module makes it (its own
    attentions keep nothing), and kept: each later forward reads it again."""
    cache = _ACTIVE[0]
    if cache is None:
        return function(*args, **keys)
    slot, cache.prompt_slot = cache.prompt_slot, cache.prompt_slot + 1
    if slot == len(cache.prompt):
        _ACTIVE[0] = None
        try:
            cache.prompt.append(function(*args, **keys))
        finally:
            _ACTIVE[0] = cache
    return cache.prompt[slot]


def cached_matmul(a: Tensor, b: Tensor, *, keys: int, dtype: torch.dtype) -> Tensor:
    """`a @ b` of attention written out, B's positions on its axis `keys`: Kᵀ's on its
    last (the scores' columns), V's on its rows. Without a generation running, the plain
    product. While one runs, B is every key stored and the chunk's: kept as [..., positions,
    dim] in `dtype` (a copy), as transformers keeps its keys, and read back in B's layout;
    V only after the scores' causal mask (the compiler checks it where it is written
    unconditionally, this where a flag decides it).
    """
    cache = _ACTIVE[0]
    if cache is None:
        return a @ b
    if keys == -1:
        cache.masked = False
        return a @ cache.extend(b.mT, dtype).mT
    if not cache.masked:
        raise ValueError(
            "attention written out read its values with weights no causal mask covered: "
            "a cached step has only the keys up to its own position, where the whole "
            "sequence's forward sees every key (a flag left the causal mask out)"
        )
    return a @ cache.extend(b, dtype)


def cached_causal_mask(scores: Tensor, fill: float = float("-inf")) -> Tensor:
    """`sx.causal_mask` of the scores of attention written out. Without a generation
    running, the plain op. While one runs, the scores' columns are every key stored and
    the chunk's: the mask is aligned bottom-right, query i of the chunk sees the keys up
    to its own position (in a static cache, none of those to come)."""
    cache = _ACTIVE[0]
    if cache is None:
        return causal_mask(scores, fill)
    cache.masked = True
    queries, keys = scores.shape[-2], scores.shape[-1]
    query_at, key_at = cache.positions(queries, 0, keys, scores.device)
    return scores.masked_fill(key_at > query_at[:, None], fill)


def _plain(q, k, v, scale, window, enable_gqa, softcap, round) -> Tensor:
    """The attention the module computes without a generation running: the plain op's."""
    if softcap is not None:
        return eager_attention(
            q,
            k,
            v,
            softcap=softcap,
            scale=scale,
            causal=True,
            window=window,
            enable_gqa=enable_gqa,
            round=round,
        )
    extra = {} if scale is None else {"scale": scale}
    if window is not None:
        mask = window_mask(q.shape[-2], window, q.device)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=enable_gqa, **extra
        )
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=enable_gqa, **extra
    )


def _static(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    query_at: Tensor,
    key_at: Tensor,
    keep,
    window,
    extra,
) -> Tensor:
    """Attention over a static cache's capacity, transformers' static formulation: the
    prompt (S > 1 from position 0, no padding) with `is_causal` over its own keys; a later
    chunk, or a padded prompt, with the boolean mask `[B, 1, S, capacity]` of the keys it
    sees (`keep` [B, capacity]: the keys that are not pads)."""
    batch, heads, queries, dim = q.shape
    groups = heads // k.shape[-3]
    gqa = {"enable_gqa": True} if groups > 1 else {}
    if queries > 1 and window is None and keep is None and int(query_at[0]) == 0:
        k, v = k[..., :queries, :], v[..., :queries, :]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa, **extra)
    mask = seen(query_at, key_at, window).expand(batch, 1, queries, -1)
    if keep is not None:
        mask = mask & keep[:, None, None, key_at]
    return _masked(q, k, v, mask, extra)


def _masked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, extra) -> Tensor:
    """SDPA with a boolean mask `[B, 1, S, L]`, as transformers calls it beside one:
    grouped-query heads folded into the query axis for one query, repeated otherwise."""
    batch, heads, queries, dim = q.shape
    groups = heads // k.shape[-3]
    mask = mask.contiguous()
    if groups == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **extra)
    if queries == 1:
        folded = q.reshape(batch, heads // groups, groups, dim)
        y = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, **extra)
        return y.reshape(batch, heads, 1, dim)
    k = k.repeat_interleave(groups, dim=-3)
    v = v.repeat_interleave(groups, dim=-3)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **extra)


def cached_conv1d(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    *,
    dtype: torch.dtype,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
) -> Tensor:
    """`conv1d` along the sequence (the last axis of X), causal: padded by P = (K - 1) x
    dilation, its first L outputs the positions'. Without a generation running, the plain
    op. While one runs, the chunk is read after the P inputs before it (zeros before the
    prompt), which the cache keeps in `dtype` (a copy), and the outputs are the chunk's
    positions and then its padding's, as the plain op's are: the prompt's the plain op's,
    a later chunk's F.conv1d over its window, as transformers' `causal_conv1d_update`.
    """
    keys = dict(stride=stride, dilation=dilation, groups=groups)
    cache = _ACTIVE[0]
    if cache is None:
        return F.conv1d(x, weight, bias, padding=padding, **keys)
    causal = dilation * (weight.shape[-1] - 1)
    if stride != 1 or padding != causal:
        raise ValueError(
            f"a cached convolution must be causal: stride 1 and padding {causal} "
            f"((kernel - 1) x dilation), got stride {stride} and padding {padding}"
        )
    if x.dtype != dtype:
        raise TypeError(f"the cache holds {dtype}, the convolution read {x.dtype}")
    before = cache.state()
    if before is None:
        out = F.conv1d(x, weight, bias, padding=padding, **keys)
        before = x.new_zeros(*x.shape[:-1], padding)
    else:
        window = F.pad(torch.cat([before, x], dim=-1), (0, padding))
        out = F.conv1d(window, weight, bias, **keys)
    cache.keep_state(torch.cat([before, x], dim=-1)[..., x.shape[-1] :], dtype)
    return out


def cached_linear_scan(a: Tensor, b: Tensor, dim: int, *, dtype: torch.dtype) -> Tensor:
    """`linear-scan` along the sequence: h_t = a_t * h_{t-1} + b_t. Without a generation
    running, the plain op (h_{-1} = 0). While one runs, h_{-1} is the last value of the
    chunk before (kept in `dtype`, a copy), carried into the first step as the loop writes
    it, a_0 * h_{-1} + b_0; then the plain scan, whose first step gives b_0 as it is."""
    cache = _ACTIVE[0]
    if cache is None:
        return linear_scan(a, b, dim)
    before = cache.state()
    if before is not None:
        a, b = torch.broadcast_tensors(a, b)
        first = a.narrow(dim, 0, 1) * before.unsqueeze(dim) + b.narrow(dim, 0, 1)
        b = torch.cat([first, b.narrow(dim, 1, b.shape[dim] - 1)], dim)
    out = linear_scan(a, b, dim)
    cache.keep_state(out.select(dim, -1), dtype)
    return out


def cache_positions(like: Tensor, axis: int, dtype=None) -> Tensor:
    """Positions along the sequence axis: 0..n-1 without a generation, else the chunk's
    positions after the tokens stored (`arange-of` with a dtype, `positions` as int64).
    """
    cache = _ACTIVE[0]
    size = like.shape[axis]
    if cache is None:
        return torch.arange(size, dtype=dtype, device=like.device)
    if cache.rows is not None:
        if like.dim() != 2:
            raise ValueError(
                "left-padded prompts need each row's positions, which this model reads "
                f"from a {like.dim()}-d value's axis {axis}, shared by the rows: give "
                "prompts of one length, or take positions from the [batch, length] ids"
            )
        return cache.rows if dtype is None else cache.rows.to(dtype)
    if cache.capacity:
        return cache.position if dtype is None else cache.position.to(dtype)
    return torch.arange(
        cache.length, cache.length + size, dtype=dtype, device=like.device
    )


def last_position(x: Tensor, axis: int) -> Tensor:
    """While generating, `x` at the last position of the sequence axis (kept as an axis of
    size 1): the lm_head of transformers' `logits_to_keep=1`; else `x`."""
    if _ACTIVE[0] is None:
        return x
    return x.narrow(axis, x.shape[axis] - 1, 1)
