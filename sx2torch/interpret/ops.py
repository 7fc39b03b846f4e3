"""The ops as eager torch calls on tensors already cast to the dtype the op computes in.

Each entry says how the op's dtype is chosen (`kind`) and which positions decide no dtype
and are never cast (`skip`: shape-only LIKE operands, integer ids). Ops defined by other ops
(rms-norm, layer-norm, causal-attention, ...) are in evaluate.py, built from these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import Callable

import torch
from torch.nn import functional as F

FLOAT, KEEP, BOOL, ISLAND, RUN = "float", "keep", "bool", "island", "run"
F32 = torch.float32


@dataclass(frozen=True)
class Spec:
    fn: Callable  # (args, keys) -> value
    kind: str = FLOAT  # FLOAT: the compute dtype; KEEP: moves data (ints pass through);
    # BOOL: compares in the compute dtype; ISLAND: a library mark, f32 wherever called;
    # RUN: the run's precision whatever the inputs (under the marks); or a function of
    # the keys giving one (softmax's :dtype)
    skip: tuple = ()  # positions that decide no dtype and are not cast
    lists: bool = False  # the first argument is a vector of tensors
    training: bool = False  # reads the model's training mode, as keys["training"]

    def kind_of(self, keys: dict) -> str:
        return self.kind(keys) if callable(self.kind) else self.kind


def _dims(axes):
    return None if axes is None else tuple(axes)


def _reduce(fn):
    def apply(a, k):
        dims = _dims(k.get("axes"))
        keep = bool(k.get("keepdims", False))
        if dims is None:
            dims = tuple(range(a[0].dim()))
        return fn(a[0], dim=dims, keepdim=keep)

    return apply


def _take(a, k):
    """Rows of the table; with a :padding-idx, torch's embedding, whose derivative leaves
    that row's gradient zero."""
    if k.get("padding-idx") is None:
        return a[0][a[1]]
    return F.embedding(a[1], a[0], padding_idx=k["padding-idx"])


def _axis(k, default=-1):
    """A routing op's :axis (sx2torch/ops/routing.py)."""
    return k.get("axis", default)


def _sparse_experts(a, k):
    """Expert by expert, the rows that chose it: their gated MLP, weighted, added back."""
    x, index, weights, gate_up, down = a
    experts = gate_up.shape[0]
    if index.numel() and not 0 <= int(index.min()) <= int(index.max()) < experts:
        # the module's F.one_hot refuses it; no expert here would take the row
        raise RuntimeError(f"sparse-experts: an expert index outside [0, {experts})")
    out = torch.zeros_like(x)
    for expert in range(experts):
        chose = index == expert  # [T, K], at most one K per row
        rows = chose.any(dim=-1).nonzero()[:, 0]
        if len(rows) == 0:
            continue
        gate, up = (x[rows] @ gate_up[expert].T).chunk(2, dim=-1)
        h = (F.silu(gate) * up) @ down[expert].T
        weight = weights[rows][chose[rows]]  # the one weight of each row
        out[rows] += (h * weight[:, None]).to(x.dtype)
    return out


def _reshape(a, k):
    """A 0 in the shape keeps the input's size on that axis (as examples/tiny-gpt's heads);
    a first `...` the input's axes but the last."""
    x = a[0]
    if a[1][:1] == [Ellipsis]:
        return x.reshape(*x.shape[:-1], *a[1][1:])
    return x.reshape(tuple(x.shape[i] if n == 0 else n for i, n in enumerate(a[1])))


def _slice(a, k):
    x, axis = a[0], k.get("axis", 0)
    index = [slice(None)] * x.dim()
    index[axis] = slice(k.get("start", 0), k.get("end"), k.get("step", 1))
    return x[tuple(index)]


def _squeeze(a, k):
    axis = k.get("axis")
    return a[0].squeeze() if axis is None else a[0].squeeze(axis)


def _repeat_interleave(a, k):
    return torch.repeat_interleave(a[0], k["repeats"], dim=k.get("axis"))


def _roll(a, k):
    axis = k.get("axis")
    return torch.roll(a[0], k.get("shifts", 0), () if axis is None else axis)


def _previous(a, k):
    h, axis = a[0], k.get("axis", 1)
    n = h.shape[axis]
    shifted = torch.cat(
        [torch.zeros_like(h.narrow(axis, 0, 1)), h.narrow(axis, 0, n - 1)], dim=axis
    )
    return shifted


def _causal_mask(a, k):
    x = a[0]
    n, m = x.shape[-2], x.shape[-1]
    above = torch.ones(n, m, dtype=torch.bool).triu(1)
    return x.masked_fill(above, k.get("fill", -math.inf))


def _linear_scan(a, k):
    coef, inp = torch.broadcast_tensors(a[0], a[1])
    axis = k.get("axis", 1) % coef.dim()
    h, out = torch.zeros_like(inp.select(axis, 0)), []
    for t in range(inp.shape[axis]):
        h = coef.select(axis, t) * h + inp.select(axis, t)
        out.append(h)
    return torch.stack(out, dim=axis)


def _matrix_scan(a, k):
    coef, inp = a
    batch = torch.broadcast_shapes(coef.shape[:-2], inp.shape[:-1])
    coef = coef.expand(*batch, *coef.shape[-2:])
    inp = inp.expand(*batch, inp.shape[-1])
    axis = k.get("axis", 1) % len(batch)
    h, out = torch.zeros_like(inp.select(axis, 0)), []
    for t in range(inp.shape[axis]):
        step = coef.select(axis, t)
        h = (step @ h.unsqueeze(-1)).squeeze(-1) + inp.select(axis, t)
        out.append(h)
    return torch.stack(out, dim=axis)


def _softcapped(q, key, v, allowed, mask, k):
    """transformers' eager_attention_forward with Gemma 2's soft-cap, in Q's dtype: the
    scores, scaled, capped tanh(s / C) C, masked, an f32 softmax read back in Q's dtype.
    """
    if k.get("enable-gqa", False):
        groups = q.shape[-3] // key.shape[-3]
        key, v = (t.repeat_interleave(groups, dim=-3) for t in (key, v))
    scale = k.get("scale")
    scores = (q @ key.transpose(-1, -2)) * (
        q.shape[-1] ** -0.5 if scale is None else scale
    )
    cap = k["softcap"]
    scores = torch.tanh(scores / cap) * cap
    if mask is not None and mask.dtype == torch.bool:
        allowed = mask if allowed is None else allowed & mask
    elif mask is not None:
        scores = scores + mask
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    return torch.softmax(scores, dim=-1, dtype=F32).to(q.dtype) @ v


def _attention(a, k):
    """SDPA; a MASK (booleans: True sees; or floats added, read in Q's dtype) is restricted
    to the keys :causal or :window allow."""
    q, key, v = a[:3]
    t, s = q.shape[-2], key.shape[-2]
    i, j = torch.arange(t).unsqueeze(-1), torch.arange(s)
    window = k.get("window")
    allowed = None
    if window is not None:
        allowed = (j <= i) & (j >= i - window)
    elif k.get("causal", False) and (len(a) == 4 or k.get("softcap") is not None):
        allowed = j <= i
    mask = a[3] if len(a) == 4 else None
    if mask is not None and mask.is_floating_point():
        mask = mask.to(q.dtype)
    if k.get("softcap") is not None:
        return _softcapped(q, key, v, allowed, mask, k)
    if mask is None:
        mask = allowed
    elif allowed is not None:
        mask = (
            mask & allowed
            if mask.dtype == torch.bool
            else mask.masked_fill(~allowed, -math.inf)
        )
    return F.scaled_dot_product_attention(
        q,
        key,
        v,
        attn_mask=mask,
        is_causal=bool(k.get("causal", False)) and mask is None,
        scale=k.get("scale"),
        enable_gqa=bool(k.get("enable-gqa", False)),
    )


def _fused_rms_norm(a, k):
    x = a[0]
    weight = a[1] if len(a) > 1 else None
    return F.rms_norm(x, (x.shape[-1],), weight, k.get("eps"))


def _fused_layer_norm(a, k):
    x, weight, bias = (a + [None, None])[:3]
    return F.layer_norm(x, (x.shape[-1],), weight, bias, k.get("eps", 1e-05))


def _cross_entropy(a, k):
    reduction = k.get("reduction", ":mean").lstrip(":")
    return F.cross_entropy(a[0], a[1], reduction=reduction)


def _keyword(value):
    """A keyword argument (`:same`) as torch's string; numbers and sizes as they are."""
    return value.lstrip(":") if isinstance(value, str) else value


def _conv(fn, *extra):
    """A convolution's call; `extra`: its other size keys (a transposed one's
    :output-padding), with their defaults."""

    def apply(a, k):
        keys = (("stride", 1), ("padding", 0), ("dilation", 1), *extra)
        sizes = {
            name.replace("-", "_"): _keyword(k.get(name, default))
            for name, default in keys
        }
        return fn(*a, **sizes, groups=k.get("groups", 1))

    return Spec(apply)


def _pool(fn, kind=FLOAT):
    return Spec(
        lambda a, k: fn(
            a[0], a[1], stride=k.get("stride"), padding=k.get("padding", 0)
        ),
        kind,
    )


def _interpolate(a, k):
    mode = _keyword(k.get("mode", ":nearest"))
    corners = k.get("align-corners") if mode == "bilinear" else None
    return F.interpolate(
        a[0],
        size=k.get("size"),
        scale_factor=k.get("scale-factor"),
        mode=mode,
        align_corners=corners,
    )


def _extremum(fn):
    """Against a number, as against a 0-d tensor: it decides no dtype."""
    return Spec(lambda a, k: fn(*(torch.as_tensor(v) for v in a)), KEEP)


def _binary(fn):
    return Spec(lambda a, k: reduce(fn, a), KEEP)


OPS = {
    "+": _binary(lambda x, y: x + y),
    "*": _binary(lambda x, y: x * y),
    # integers stay integers (a layer index, token ids, positions); floats as any op
    "-": Spec(lambda a, k: -a[0] if len(a) == 1 else a[0] - a[1], KEEP),
    "/": Spec(lambda a, k: a[0] / a[1], KEEP),
    "//": Spec(lambda a, k: torch.floor_divide(a[0], a[1]), KEEP),
    "mod": Spec(lambda a, k: torch.remainder(a[0], a[1]), KEEP),
    "<": Spec(lambda a, k: a[0] < a[1], BOOL),
    "<=": Spec(lambda a, k: a[0] <= a[1], BOOL),
    "=": Spec(lambda a, k: a[0] == a[1], BOOL),
    ">": Spec(lambda a, k: a[0] > a[1], BOOL),
    ">=": Spec(lambda a, k: a[0] >= a[1], BOOL),
    "abs": Spec(lambda a, k: torch.abs(a[0]), KEEP),
    "neg": Spec(lambda a, k: -a[0], KEEP),
    "relu": Spec(lambda a, k: torch.relu(a[0]), KEEP),
    "floor": Spec(lambda a, k: torch.floor(a[0]), KEEP),
    "ceil": Spec(lambda a, k: torch.ceil(a[0]), KEEP),
    # read as it is computed: an f32 value is truncated, not its bf16 rounding
    "int": Spec(
        lambda a, k: a[0].int() if k.get("bits") == 32 else a[0].long(), KEEP, skip=(0,)
    ),
    "exp": Spec(lambda a, k: torch.exp(a[0])),
    "log": Spec(lambda a, k: torch.log(a[0])),
    "log1p": Spec(lambda a, k: torch.log1p(a[0])),
    "expm1": Spec(lambda a, k: torch.expm1(a[0])),
    "softplus": Spec(
        lambda a, k: F.softplus(a[0], k.get("beta", 1.0), k.get("threshold", 20.0))
    ),
    "sin": Spec(lambda a, k: torch.sin(a[0])),
    "cos": Spec(lambda a, k: torch.cos(a[0])),
    "tanh": Spec(lambda a, k: torch.tanh(a[0])),
    "sigmoid": Spec(lambda a, k: torch.sigmoid(a[0])),
    "silu": Spec(lambda a, k: F.silu(a[0])),
    "gelu": Spec(
        lambda a, k: F.gelu(a[0], approximate=_keyword(k.get("approximate", ":none")))
    ),
    "erf": Spec(lambda a, k: torch.erf(a[0])),
    "sqrt": Spec(lambda a, k: torch.sqrt(a[0])),
    "rsqrt": Spec(lambda a, k: torch.rsqrt(a[0])),
    "square": Spec(lambda a, k: torch.square(a[0]), KEEP),
    "pow": Spec(lambda a, k: torch.pow(a[0], a[1])),
    "maximum": _extremum(torch.maximum),
    "minimum": _extremum(torch.minimum),
    "clamp": Spec(lambda a, k: torch.clamp(a[0], k.get("min"), k.get("max")), KEEP),
    "where": Spec(lambda a, k: torch.where(*a), KEEP, skip=(0,)),
    # an integer or boolean tensor's sum is int64, as torch's; floats as any op
    "sum": Spec(_reduce(torch.sum), KEEP),
    "mean": Spec(_reduce(torch.mean)),
    "amax": Spec(_reduce(torch.amax), KEEP),
    "amin": Spec(_reduce(torch.amin), KEEP),
    "logsumexp": Spec(_reduce(torch.logsumexp), ISLAND),
    # :dtype :input: torch's kernel on X in the dtype it computes in, no island
    "softmax": Spec(
        lambda a, k: torch.softmax(a[0], k.get("axis", -1)),
        lambda k: FLOAT if k.get("dtype") == ":input" else ISLAND,
    ),
    "log-softmax": Spec(
        lambda a, k: torch.log_softmax(a[0], k.get("axis", -1)), ISLAND
    ),
    "softcap": Spec(lambda a, k: a[1] * torch.tanh(a[0] / a[1]), ISLAND),
    "cross-entropy": Spec(_cross_entropy, ISLAND, skip=(1,)),
    "matmul": Spec(lambda a, k: a[0] @ a[1]),
    "einsum": Spec(lambda a, k: torch.einsum(a[0], *a[1:]), skip=(0,)),
    "linear": Spec(lambda a, k: F.linear(*a)),
    "outer": Spec(lambda a, k: a[0].unsqueeze(-1) * a[1].unsqueeze(-2)),
    "reshape": Spec(_reshape, KEEP),
    "reshape-as": Spec(lambda a, k: a[0].reshape(a[1].shape), KEEP, skip=(1,)),
    "expand-as": Spec(lambda a, k: a[0].expand_as(a[1]), KEEP, skip=(1,)),
    "transpose": Spec(lambda a, k: a[0].permute(tuple(a[1])), KEEP),
    "swap-axes": Spec(lambda a, k: a[0].transpose(a[1], a[2]), KEEP),
    "slice": Spec(_slice, KEEP),
    "unsqueeze": Spec(lambda a, k: a[0].unsqueeze(k["axis"]), KEEP),
    "squeeze": Spec(_squeeze, KEEP),
    "contiguous": Spec(lambda a, k: a[0].contiguous(), KEEP),
    "flatten": Spec(
        lambda a, k: torch.flatten(a[0], k.get("start", 0), k.get("end", -1)), KEEP
    ),
    "repeat-interleave": Spec(_repeat_interleave, KEEP),
    "roll": Spec(_roll, KEEP),
    "concat": Spec(
        lambda a, k: torch.cat(a[0], dim=k.get("axis", 0)), KEEP, lists=True
    ),
    "stack": Spec(
        lambda a, k: torch.stack(a[0], dim=k.get("axis", 0)), KEEP, lists=True
    ),
    "pad": Spec(lambda a, k: F.pad(a[0], tuple(a[1]), value=k.get("value", 0.0)), KEEP),
    "at": Spec(lambda a, k: a[0][a[1]], KEEP),
    "take": Spec(_take, KEEP, skip=(1,)),
    "previous": Spec(_previous, KEEP),
    "causal-mask": Spec(_causal_mask, KEEP),
    "zeros-like": Spec(lambda a, k: torch.zeros(a[0].shape), skip=(0,)),
    "ones-like": Spec(lambda a, k: torch.ones(a[0].shape), skip=(0,)),
    "arange": Spec(lambda a, k: torch.arange(a[1], a[2], a[3]), skip=(0,)),
    "arange-of": Spec(
        lambda a, k: torch.arange(a[0].shape[k.get("axis", -1)]), skip=(0,)
    ),
    "size": Spec(lambda a, k: a[0].shape[k.get("axis", -1)], KEEP, skip=(0,)),
    "len": Spec(lambda a, k: a[0].shape[0], KEEP, skip=(0,)),
    "positions": Spec(
        lambda a, k: torch.arange(a[0].shape[k.get("axis", -1)]), KEEP, skip=(0,)
    ),
    # drawn from torch's generator in f32, as the module draws them
    "randn-like": Spec(lambda a, k: torch.randn_like(a[0], dtype=F32), skip=(0,)),
    "rand-like": Spec(lambda a, k: torch.rand_like(a[0], dtype=F32), skip=(0,)),
    "dropout": Spec(lambda a, k: F.dropout(a[0], a[1], k["training"]), training=True),
    "scalar-like": Spec(lambda a, k: torch.tensor(a[1], dtype=torch.float64)),
    "cast-run": Spec(lambda a, k: a[0], RUN),
    "linspace": Spec(lambda a, k: torch.linspace(a[1], a[2], a[3]), skip=(0,)),
    "attention-scale": Spec(lambda a, k: a[0] / math.sqrt(a[1].shape[-1]), skip=(1,)),
    "attention": Spec(_attention, skip=(3,)),
    "fused-rms-norm": Spec(_fused_rms_norm),
    "fused-layer-norm": Spec(_fused_layer_norm),
    "group-norm": Spec(
        lambda a, k: F.group_norm(a[0], a[1], *a[2:], eps=k.get("eps", 1e-05)), ISLAND
    ),
    "one-hot": Spec(lambda a, k: F.one_hot(a[0], a[1]), skip=(0,)),
    "topk": Spec(
        lambda a, k: tuple(
            torch.topk(a[0], a[1], dim=_axis(k), sorted=k.get("sorted", True))
        ),
        KEEP,
    ),
    "argmax": Spec(lambda a, k: torch.argmax(a[0], dim=_axis(k)), KEEP),
    "gather": Spec(lambda a, k: torch.gather(a[0], _axis(k), a[1]), KEEP, skip=(1,)),
    "index-select": Spec(
        lambda a, k: torch.index_select(a[0], _axis(k, 0), a[1]), KEEP, skip=(1,)
    ),
    "scatter-add": Spec(lambda a, k: a[0].scatter_add(_axis(k), a[1], a[2]), skip=(1,)),
    "index-add": Spec(lambda a, k: a[0].index_add(_axis(k, 0), a[1], a[2]), skip=(1,)),
    "cumsum": Spec(lambda a, k: torch.cumsum(a[0], dim=_axis(k)), KEEP),
    "conv1d": _conv(F.conv1d),
    "conv2d": _conv(F.conv2d),
    "conv-transpose1d": _conv(F.conv_transpose1d, ("output-padding", 0)),
    "conv-transpose2d": _conv(F.conv_transpose2d, ("output-padding", 0)),
    "max-pool1d": _pool(F.max_pool1d, KEEP),
    "max-pool2d": _pool(F.max_pool2d, KEEP),
    "avg-pool1d": _pool(F.avg_pool1d),
    "avg-pool2d": _pool(F.avg_pool2d),
    "interpolate": Spec(_interpolate),
    "sparse-experts": Spec(_sparse_experts, skip=(1, 2)),
    "linear-scan": Spec(_linear_scan, ISLAND),
    "matrix-scan": Spec(_matrix_scan, ISLAND),
}

# The elementwise functions, which the rules compute as their f32 value rounded once to
# bf16, as a GPU's kernel does and the held targets write. torch's CPU kernels on bf16 do so
# for most, not all: of the 65,024 finite bf16 inputs, erf gives another value for 28,436 and
# gelu for 256, and rsqrt for 9,017 on a tensor shorter than a vector (the tester's 2x4), whose
# scalar loop rounds the square root to bf16 before its reciprocal.
FUNCTIONS = {"exp", "log", "sin", "cos", "tanh", "sigmoid", "silu", "gelu", "erf"}
FUNCTIONS |= {"sqrt", "rsqrt", "log1p", "expm1", "softplus"}
