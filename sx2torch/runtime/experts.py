"""A mixture of experts' sparse layer: each token through only the experts its router chose.

The dispatch is transformers' own (MixtralExperts, eager): a loop over the experts that at
least one token chose, each taking its tokens by index (`x[token]`), computing its gated
MLP on them alone, and adding the weighted result back at their rows (`index_add_`). The
number of tokens an expert gets is known only when the module runs, so this is a function
of the runtime rather than generated statements: autograd differentiates it
(`loss.backward()`); torch.compile(fullgraph=True) cannot trace the data-dependent loop.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from sx2torch.runtime.rounding import round_to_bf16, store_bf16


def sparse_experts(
    x: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    held: bool = False,
) -> torch.Tensor:
    """x [T, H], index and weights [T, K] (the router's choices and their weights, in the
    router's dtype), gate_up [E, 2I, H], down [E, H, I] -> [T, H] in x's dtype.

    With ``held=True`` (the metal and cpu targets under bf16) x, gate_up and down are bf16
    values held in f32 tensors: each op computes in f32 and stores its result rounded, as
    the cuda target's bf16 ops round each linear, the SiLU, the product and each addition
    (and the gradients each sends back), rather than computing the whole layer in f32 and
    rounding once.
    """
    store = store_bf16 if held else _unchanged
    # The weighted result, f32 (a bf16 value times the router's f32 weight), rounded to
    # x's dtype before the sum.
    narrow = round_to_bf16 if held else (lambda h: h.to(x.dtype))
    out = torch.zeros_like(x)
    with torch.no_grad():
        chosen = F.one_hot(index, num_classes=gate_up.shape[0]).permute(2, 1, 0)
        hit = torch.greater(chosen.sum(dim=(-1, -2)), 0).nonzero()
    for expert in hit[:, 0]:
        position, token = torch.where(chosen[expert])
        gate, up = store(F.linear(x[token], gate_up[expert])).chunk(2, dim=-1)
        h = store(F.linear(store(store(F.silu(gate)) * up), down[expert]))
        h = h * weights[token, position, None]
        out = store(out.index_add_(0, token, narrow(h)))
    return out


def _unchanged(x: torch.Tensor) -> torch.Tensor:
    """Native bf16 ops round on store by themselves."""
    return x
