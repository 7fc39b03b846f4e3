"""The cache's recurrent states (sx2torch/runtime/cache.py): a causal convolution and a linear
scan run chunk by chunk inside `generating` give what the plain op gives over the whole
sequence, checked against F.conv1d and the recurrence written as a loop."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from sx2torch.runtime.cache import (
    Cache,
    cached_conv1d,
    cached_linear_scan,
    generating,
)

CHUNKS = (4, 1, 1, 3, 1)  # a prompt, then tokens, then a chunk of three after a state


def chunked(step, x: torch.Tensor, axis: int) -> list:
    """`step` run on consecutive chunks of `x` along `axis`, in one generation."""
    cache, outs, at = Cache(), [], 0
    with generating(cache):
        for size in CHUNKS:
            cache.begin(at)
            outs.append(step(x.narrow(axis, at, size)))
            at += size
    return outs


@pytest.mark.parametrize(
    "groups, dilation", [(6, 1), (1, 1), (6, 2)], ids=["depthwise", "dense", "dilated"]
)
def test_a_causal_convolution_chunk_by_chunk_is_the_whole_sequences(groups, dilation):
    """Each chunk's first outputs are the whole convolution's at its positions (the prompt
    bit for bit, a later chunk's window summed alike within f32 rounding), then its
    padding's; the state is the inputs before the chunk, in the input's dtype."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 10, generator=g)
    w = torch.randn(6, 6 // groups, 4, generator=g)
    bias = torch.randn(6, generator=g)
    padding = 3 * dilation
    keys = dict(padding=padding, dilation=dilation, groups=groups)
    whole = F.conv1d(x, w, bias, **keys)[..., :10]
    outs = chunked(
        lambda chunk: cached_conv1d(chunk, w, bias, dtype=torch.float32, **keys), x, -1
    )
    assert [o.shape[-1] for o in outs] == [s + padding for s in CHUNKS]
    assert torch.equal(outs[0][..., :4], whole[..., :4])
    got = torch.cat([o[..., :s] for o, s in zip(outs, CHUNKS)], dim=-1)
    torch.testing.assert_close(got, whole, rtol=0, atol=1e-5)


def test_a_convolution_that_is_not_causal_is_refused_while_generating():
    x, w = torch.randn(1, 2, 5), torch.randn(2, 1, 3)
    # outside a generation it is the plain op, whatever its padding
    assert torch.equal(
        cached_conv1d(x, w, padding=1, groups=2, dtype=torch.float32),
        F.conv1d(x, w, padding=1, groups=2),
    )
    with generating(Cache()), pytest.raises(ValueError, match="must be causal"):
        cached_conv1d(x, w, padding=1, groups=2, dtype=torch.float32)
    with generating(Cache()), pytest.raises(TypeError, match="the cache holds"):
        cached_conv1d(x, w, padding=2, groups=2, dtype=torch.bfloat16)


def loop(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    """h_t = a_t * h_{t-1} + b_t, h_{-1} = 0, one step at a time."""
    h, states = torch.zeros(()), []
    for a_t, b_t in zip(a.unbind(dim), b.unbind(dim)):
        h = a_t * h + b_t
        states.append(h)
    return torch.stack(states, dim)


def test_a_scan_chunk_by_chunk_carries_its_last_value():
    """A broadcast decay [B, I, L, 1] and inputs [B, I, L, N] along axis 2: each chunk
    continues the recurrence from the last value kept (a copy, in f32), its first step the
    loop's arithmetic bit for bit."""
    g = torch.Generator().manual_seed(1)
    a = torch.rand(2, 3, 10, 1, generator=g)
    b = torch.randn(2, 3, 10, 4, generator=g)
    want = loop(a.expand_as(b), b, 2)
    outs = chunked(
        lambda ab: cached_linear_scan(*ab, dim=2, dtype=torch.float32),
        torch.stack(torch.broadcast_tensors(a, b)),
        3,
    )
    got = torch.cat(outs, dim=2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # each chunk's first step after the prompt, from the value the chunk before left
    for at in (4, 5, 6, 9):
        step = a[:, :, at] * got[:, :, at - 1] + b[:, :, at]
        assert torch.equal(got[:, :, at], step)
