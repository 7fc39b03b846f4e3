"""Fused kernels beside the seed's compositions: one torch call, one rounding.

The seed's `rms-norm` and `causal-attention` are written out in ops, so under `:bf16`
each step rounds as the precision page says. The ops here are the kernels PyTorch
models call instead (`F.rms_norm`, `F.linear`, `F.scaled_dot_product_attention`):
each accumulates in f32 inside, as a matmul's `:out :f32` does, and stores its result
once in the dtype it computes in. They carry no f32-island mark: under `:bf16` they read
bf16 and store bf16, as the same call does in PyTorch. On the metal and cpu targets,
which hold bf16 values in f32, the call runs in f32 and its result is rounded once.
"""

import libcst as cst

import sx2torch.build as b
from sx2torch.ir import Scalar
from sx2torch.syntax.scalars import ScalarOp
import sx2torch.ops.sequence as sequence
from sx2torch.ops import sharding
from sx2torch.ops.registry import Arg, Key, Op, register
from sx2torch.ops.rank import ATTENTION, RankRule, ShapeError, like, product

LINEAR = RankRule(
    "X's with the last axis W's first",
    lambda shapes, attrs: product(
        shapes[0], None if shapes[1] is None else tuple(reversed(shapes[1]))
    ),
)
LAST_AXIS = RankRule(
    "X's last axis",
    lambda shapes, attrs: None if shapes[1] is None else shapes[1][-1:],
)


def _normed(shapes, attrs):
    """torch reads X's last axis (`x.size(-1)`, the normalized shape) when the module runs:
    a 0-d X is refused when it compiles."""
    if shapes[0] == ():
        raise ShapeError(
            "a norm of a 0-d value (a number, an element, a full reduction or a parameter "
            "of shape []): it normalizes over the last axis, and this has none"
        )
    return shapes[0]


NORMED = RankRule("same as X, which has a last axis", _normed, tails=True)
TRUE = Scalar.lit(True)
LAST = (Scalar.lit(-1),)


def _rms_norm(a, ctx):
    x = a[0]
    extra = {} if len(a) == 1 else {"weight": a[1]}
    if ctx.attrs["eps"] is not None:
        extra["eps"] = ctx.attrs["eps"]
    shape = b.tuple_([b.method(x, "size", b.number(-1))])
    return b.call("F.rms_norm", x, shape, **extra)


def _rms_norm_grad(t, n, g):
    """The kernel's backward, one kernel as its forward is: f32 inside, rounded once to
    the dtype it computes in, for X and for WEIGHT (written out in ops, the cancelling
    difference r·(u - n·mean(u·n)) was rounded in bf16 at each step)."""
    eps = n.attrs["eps"]  # None: torch's, as the helpers' default is
    x, *weight = n.inputs
    dx = t.op("rms-norm-backward", [g, x, *weight], eps=eps)
    if not weight:
        return [dx]
    return [dx, t.op("rms-norm-weight-backward", [g, x], eps=eps)]


def _rms_norm_backward(helper):
    def emit(a, ctx):
        eps = ctx.attrs["eps"]
        return b.call(helper, *a, **({} if eps is None else {"eps": eps}))

    return emit


for _name, _args, _helper, _gives in (
    (
        "rms-norm-backward",
        (Arg("g"), Arg("x"), Arg("weight")),
        "sx.rms_norm_backward",
        "X",
    ),
    (
        "rms-norm-weight-backward",
        (Arg("g"), Arg("x")),
        "sx.rms_norm_weight_backward",
        "WEIGHT",
    ),
):
    register(
        Op(
            _name,
            _args,
            _rms_norm_backward(_helper),
            keys=(Key("eps", "number"),),
            arity=(2, len(_args)),
            rank=like(1, "x") if _gives == "X" else LAST_AXIS,
            doc=f"fused-rms-norm's gradient with respect to {_gives}: f32 inside, rounded once",
            internal=True,
        )
    )


register(
    Op(
        "fused-rms-norm",
        (Arg("x"), Arg("weight", "matrix")),
        _rms_norm,
        keys=(Key("eps", "number"),),
        arity=(1, 2),
        name_inputs=True,
        grad=_rms_norm_grad,
        doc=(
            "F.rms_norm over the last axis, times WEIGHT if given: one kernel, f32 inside, "
            "rounded once to the dtype it computes in (a :bf16 run reads bf16 and stores bf16, "
            "as PyTorch's call does). :eps defaults to torch's: finfo(float32).eps for f32 "
            "and bf16 input"
        ),
        rank=NORMED,
    )
)


def _layer_norm(a, ctx):
    x = a[0]
    # the last axis: the weight's shape where there is one, so x is read once
    shape = (
        b.attr(_uncast(a[1]), "shape")
        if len(a) > 1
        else b.subscript(b.attr(x, "shape"), b.slice_(b.number(-1), None))
    )
    extra = {"eps": ctx.attrs["eps"]} if ctx.values["eps"] != 1e-5 else {}
    return b.call("F.layer_norm", x, shape, *a[1:], **extra)


def _uncast(weight):
    """`w` of `w.to(dtype)`: the same shape, read without a copy of the weight."""
    cast = (
        isinstance(weight, cst.Call)
        and isinstance(weight.func, cst.Attribute)
        and weight.func.attr.value == "to"
    )
    return weight.func.value if cast else weight


def _layer_norm_grad(t, n, g):
    """With r = rsqrt(var(x) + eps), n = (x - mean x)·r and u = g·w:
    dx = r·(u - mean(u) - n·mean(u·n)), dw = Σ g·n, db = Σ g."""
    x = n.inputs[0]
    with t.library_island():
        centered = t.op("-", [x, t.op("mean", [x], axes=LAST, keepdims=TRUE)])
        variance = t.op(
            "mean", [t.op("*", [centered, centered])], axes=LAST, keepdims=TRUE
        )
        inverse_std = t.op("rsqrt", [t.op("+", [variance, n.attrs["eps"]])])
    normed = t.op("*", [centered, inverse_std])
    u = g if len(n.inputs) == 1 else t.op("*", [g, n.inputs[1]])
    mean_u = t.op("mean", [u], axes=LAST, keepdims=TRUE)
    along = t.op("mean", [t.op("*", [u, normed])], axes=LAST, keepdims=TRUE)
    inner = t.op("-", [t.op("-", [u, mean_u]), t.op("*", [normed, along])])
    grads = [t.op("*", [inverse_std, inner])]
    if len(n.inputs) > 1:
        grads.append(t.sum_back(t.op("*", [g, normed]), n, 1))
    if len(n.inputs) > 2:
        grads.append(t.sum_back(g, n, 2))
    return grads


register(
    Op(
        "fused-layer-norm",
        (Arg("x"), Arg("weight", "matrix"), Arg("bias", "matrix")),
        _layer_norm,
        keys=(Key("eps", "number", 1e-5),),
        arity=(1, 3),
        name_inputs=True,
        grad=_layer_norm_grad,
        doc=(
            "F.layer_norm over the last axis, times WEIGHT and plus BIAS if given: one "
            "kernel, mean, variance, scale and shift in f32 inside, rounded once to the "
            "dtype it computes in (a :bf16 run reads bf16 and stores bf16, as nn.LayerNorm "
            "on bf16 does). :eps defaults to torch's 1e-5"
        ),
        rank=NORMED,
    )
)


def _linear(a, ctx):
    return b.call("F.linear", *a)


def _linear_grad(t, n, g):
    """dx = g W, dW = Σ gᵀ x over the batch axes (x of rank 2 or more), db = Σ g."""
    x, w = n.inputs[:2]
    rows = t.op("swap-axes", [g], a=Scalar.lit(-1), b=Scalar.lit(-2))
    grads = [
        t.op("matmul", [g, w]),
        t.op("sum-to", [t.op("matmul", [rows, x]), w]),
    ]
    if len(n.inputs) == 3:
        grads.append(t.op("sum-to", [g, n.inputs[2]]))
    return grads


register(
    Op(
        "linear",
        (Arg("x", "matrix"), Arg("w", "matrix"), Arg("bias", "matrix")),
        _linear,
        arity=(2, 3),
        grad=_linear_grad,
        shards=sharding.linear,
        doc=(
            "F.linear: x Wᵀ (+ BIAS), W in torch's [out, in] layout; the bias is added in "
            "the f32 accumulator and the sum rounded once (addmm), as :out :f32 accumulates "
            "and then stores in the dtype it computes in"
        ),
        autocasts=True,
        rank=LINEAR,
    )
)


def _literal_false(flag) -> bool:
    return isinstance(flag, cst.Name) and flag.value == "False"


def _reads_q_and_k_twice(node) -> bool:
    """A window, or a mask beside :causal, makes the code read q's and k's shapes: they are
    locals there, and only there."""
    if node.attrs["softcap"] is not None:  # sx.eager_attention reads each once
        return False
    causal = node.attrs["causal"]
    never = causal.op is ScalarOp.LIT and causal.value is False
    return node.attrs["window"] is not None or (len(node.inputs) == 4 and not never)


def held_rounding(ctx) -> dict:
    """The `round` a runtime function is given on the targets that hold bf16 in f32
    tensors, to round where the bf16 kernels round."""
    held = ctx.compute == "bf16" and ctx.target != "cuda"
    return {"round": b.dotted("sx.round_to_bf16")} if held else {}


def _softcapped(a, ctx):
    """transformers' eager attention, which a score soft-cap needs (sx.eager_attention)."""
    extra = {"softcap": ctx.attrs["softcap"]}
    for key, word in (("scale", "scale"), ("window", "window")):
        if ctx.attrs[key] is not None:
            extra[word] = ctx.attrs[key]
    for key, word in (("causal", "causal"), ("enable-gqa", "enable_gqa")):
        if not _literal_false(ctx.attrs[key]):
            extra[word] = ctx.attrs[key]
    return b.call("sx.eager_attention", *a, **extra, **held_rounding(ctx))


def _attention(a, ctx):
    if ctx.attrs["softcap"] is not None:
        return _softcapped(a, ctx)
    q, k, v = a[:3]
    extra = {}
    length = b.subscript(b.attr(q, "shape"), b.number(-2))
    allowed = None  # the keys each query may see, where a mask is also given
    if ctx.attrs["window"] is not None:
        allowed = b.call(
            "sx.window_mask", length, ctx.attrs["window"], b.attr(q, "device")
        )
    elif len(a) == 4 and not _literal_false(ctx.attrs["causal"]):
        # is_causal cannot go with an attn_mask: the same keys, aligned top-left
        ones = b.call(
            "torch.ones",
            length,
            b.subscript(b.attr(k, "shape"), b.number(-2)),
            dtype=b.dotted("torch.bool"),
            device=b.attr(q, "device"),
        )
        allowed = b.method(ones, "tril")
    if len(a) == 4:
        extra["attn_mask"] = (
            a[3] if allowed is None else b.call("sx.restrict_mask", a[3], allowed)
        )
    elif allowed is not None:
        extra["attn_mask"] = allowed
    if ctx.attrs["scale"] is not None:
        extra["scale"] = ctx.attrs["scale"]
    # each flag an expression where a const or key decides it, left out where literally false
    if "attn_mask" not in extra and not _literal_false(ctx.attrs["causal"]):
        extra["is_causal"] = ctx.attrs["causal"]
    if not _literal_false(ctx.attrs["enable-gqa"]):
        extra["enable_gqa"] = ctx.attrs["enable-gqa"]
    return b.call("F.scaled_dot_product_attention", q, k, v, **extra)


register(
    Op(
        "attention",
        (
            Arg("q", "matrix"),
            Arg("k", "matrix"),
            Arg("v", "matrix"),
            Arg("mask", "mask"),
        ),
        _attention,
        arity=(3, 4),
        keys=(
            Key("scale", "number"),
            Key("causal", "bool", False),
            Key("window", "int"),
            Key("enable-gqa", "bool", False),
            Key("softcap", "number"),
        ),
        name_inputs=_reads_q_and_k_twice,
        shards=sharding.attention,
        no_grad="no derivative rule yet: under gradient, write the attention out by hand",
        cached=sequence.attention,
        doc=(
            "F.scaled_dot_product_attention on [..., T, D]: one kernel, its softmax and "
            "sums f32 inside, the output rounded once to the dtype it computes in. :scale "
            "defaults to 1/sqrt(D); :causal true keeps keys j <= i; :window W (causal) keeps "
            "i - W <= j <= i, flash-attn's window_size=(W, 0), as a mask built from T when "
            "the module runs; :enable-gqa true lets K and V have fewer heads than Q, each "
            "shared by a group of Q's (grouped-query attention). MASK, if given, is SDPA's "
            "attn_mask, broadcast against the scores [..., T, S]: booleans (True: the key is "
            "seen), or a float added to the scores (0 or -inf; cast to the dtype it computes "
            "in), such as a padding mask from an input [B, S] reshaped to [B 1 1 S]; with "
            ":causal or :window it is restricted to their keys (sx.restrict_mask), still one "
            "call. :softcap C (Gemma 2's score soft-cap), which has no SDPA form, computes as "
            "transformers' eager attention instead (sx.eager_attention): the scores q kᵀ "
            "rounded, scaled, soft-capped tanh(S / C) C (each step rounded), masked, the "
            "softmax in f32 rounded, times V. No derivative rule: "
            "differentiate causal-attention instead"
        ),
        autocasts=True,
        rank=ATTENTION,
    )
)
