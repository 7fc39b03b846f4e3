"""Convolutions, pooling and resizing: torch.nn.functional's kernels, one call each.

A convolution is a fused kernel as `linear` is (sx2torch/ops/fused.py): it accumulates in
f32 inside and stores its result once in the dtype it computes in, the bias added in the
accumulator; under `:bf16` it reads bf16 and stores bf16, as the same call does in PyTorch,
and on the held targets (metal, cpu) it runs in f32 and its result is rounded once. Max
pooling and nearest resizing pick input elements, so they are exact in bf16.

Sizes (stride, padding, dilation, a pool's kernel) are an integer for every spatial axis or
a vector with one per axis, as torch takes them. A convolution's derivative rule calls the
kernels autograd runs (torch.nn.grad); pooling and resizing have none yet: the emitted module
trains through torch's autograd, and a `(gradient ...)` form that reaches one is refused
where it is written.
"""

from __future__ import annotations

import sx2torch.build as b
from sx2torch.errors import SourceError
from sx2torch.ir import Scalar
import sx2torch.ops.sequence as sequence
from sx2torch.ops.rank import RankRule, known, like, value
from sx2torch.ops.registry import SYMBOLIC, Arg, Key, Op, register

NO_GRAD = (
    "no derivative rule yet: the emitted module trains through torch's autograd; "
    "(gradient ...) over it is refused"
)


def _per_axis(attr, spatial: int) -> tuple:
    """A size key as one literal (or None) per spatial axis."""
    sizes = attr if isinstance(attr, tuple) else (attr,) * spatial
    return (
        tuple(known(s) for s in sizes) if len(sizes) == spatial else (None,) * spatial
    )


def _window(size, kernel, stride, padding, dilation):
    """torch's output length: floor((L + 2p - d(k - 1) - 1) / s) + 1."""
    if None in (size, kernel, stride, padding, dilation):
        return None
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _conv_shape(spatial: int):
    def shape(shapes, attrs):
        x, w = shapes[:2]
        if x is None or len(x) not in (spatial + 1, spatial + 2):
            return None
        lead = x[: len(x) - spatial - 1]
        out = None if w is None else w[0]
        if attrs["padding"] == "same":
            return lead + (out,) + x[-spatial:]
        padding = (
            (0,) * spatial
            if attrs["padding"] == "valid"
            else _per_axis(attrs["padding"], spatial)
        )
        kernels = (None,) * spatial if w is None else w[-spatial:]
        sizes = zip(
            x[-spatial:],
            kernels,
            _per_axis(attrs["stride"], spatial),
            padding,
            _per_axis(attrs["dilation"], spatial),
        )
        return lead + (out,) + tuple(_window(*s) for s in sizes)

    return shape


def _sizes(expr):
    """A size key as Python: `2`, or the tuple `(2, 1)`."""
    return b.tuple_(list(expr)) if isinstance(expr, tuple) else expr


def given(ctx, name: str, default) -> dict:
    """`name=...` unless the key is its default written as a literal."""
    chosen = ctx.values[name]
    if chosen == default or (isinstance(chosen, tuple) and set(chosen) == {default}):
        return {}
    attr = ctx.attrs[name]
    return {name: b.string(attr) if isinstance(attr, str) else _sizes(attr)}


def conv_keys(ctx) -> dict:
    """A convolution's keys as F.conv1d's keywords, those at their defaults left out."""
    return {
        **given(ctx, "stride", 1),
        **given(ctx, "padding", 0),
        **given(ctx, "dilation", 1),
        **given(ctx, "groups", 1),
    }


def _conv_grad(name: str, spatial: int):
    def grad(t, n, g):
        """dX and dW are torch.nn.grad's convolutions of G, the kernels autograd runs;
        dBIAS is G summed over every axis but the channels'."""
        keys = {k: n.attrs[k] for k in ("stride", "padding", "dilation", "groups")}
        if keys["padding"] == "same":
            raise SourceError(
                n.span,
                f"'{name}' with :padding :same has no derivative rule yet, and (gradient "
                "...) needs one here: write the padding as numbers",
            )
        if keys["padding"] == "valid":
            keys["padding"] = Scalar.lit(0)
        x, w = n.inputs[:2]
        grads = [
            t.op(f"{name}-input-grad", [g, w, x], **keys),
            t.op(f"{name}-weight-grad", [x, g, w], **keys),
        ]
        return grads + _bias_grad(t, n, g, spatial)

    return grad


def _bias_grad(t, n, g, spatial: int) -> list:
    """dBIAS, where there is a bias: G summed over every axis but the channels', one sum,
    batched or not: to [O, 1, ...], then [O]."""
    if len(n.inputs) < 3:
        return []
    bias = n.inputs[2]
    column = (Scalar.lit(-1),) + (Scalar.lit(1),) * spatial
    like = t.op("reshape", [bias], shape=column)
    return [t.op("reshape-as", [t.op("sum-to", [g, like]), bias])]


CONV_KEYS = (
    Key("stride", "sizes", 1),
    Key("padding", "padding", 0),
    Key("dilation", "sizes", 1),
    Key("groups", "int", 1),
)

# the convolutions' rank rules, by their spatial axes (a cached conv1d's is conv1d's)
RANKS = {
    spatial: RankRule("X's, the channels W's first axis", _conv_shape(spatial))
    for spatial in (1, 2)
}
for _spatial, _name in ((1, "conv1d"), (2, "conv2d")):
    _layout = "[N, C, L]" if _spatial == 1 else "[N, C, H, W]"
    _kernel = "[O, C/groups, K]" if _spatial == 1 else "[O, C/groups, KH, KW]"
    _word = _name.replace("-", "_")
    register(
        Op(
            _name,
            (Arg("x", "matrix"), Arg("w", "matrix"), Arg("bias", "matrix")),
            lambda a, ctx, f=f"F.{_name}": b.call(f, *a, **conv_keys(ctx)),
            keys=CONV_KEYS,
            arity=(2, 3),
            grad=_conv_grad(_name, _spatial),
            autocasts=True,
            rank=RANKS[_spatial],
            # conv1d along the sequence keeps its last inputs in a :generate run's cache;
            # conv2d across it is refused
            cached=(
                sequence.convolution
                if _spatial == 1
                else sequence.spatial("convolves", 2, channels=True)
            ),
            doc=(
                f"F.{_name} of X {_layout} (or unbatched) by W {_kernel}, plus BIAS [O] if "
                "given: :stride, :padding and :dilation are an integer or one per spatial "
                "axis (:padding also :same or :valid), :groups splits the channels (C for a "
                "depthwise convolution). One kernel: f32 accumulation, the bias added in it, "
                "rounded once to the dtype it computes in. A causal convolution (Mamba's) "
                "pads K - 1 on both sides and keeps the first L outputs: "
                "(slice (conv1d x w b :padding (- k 1) :groups c) :axis -1 :end (size x :axis -1)). "
                "Its derivative rule (not with :padding :same) is torch.nn.grad's "
                f"{_name}_input and {_name}_weight"
            ),
        )
    )
    register(
        Op(
            f"{_name}-input-grad",
            (Arg("g", "matrix"), Arg("w", "matrix"), Arg("x", "like")),
            lambda a, ctx, f=f"torch.nn.grad.{_word}_input": b.call(
                f, b.attr(a[2], "shape"), a[1], a[0], **conv_keys(ctx)
            ),
            keys=CONV_KEYS,
            autocasts=True,
            rank=like(2, "x"),
            doc=f"the gradient of {_name}'s X: the transposed convolution of G by W",
            internal=True,
        )
    )
    register(
        Op(
            f"{_name}-weight-grad",
            (Arg("x", "matrix"), Arg("g", "matrix"), Arg("w", "like")),
            lambda a, ctx, f=f"torch.nn.grad.{_word}_weight": b.call(
                f, a[0], b.attr(a[2], "shape"), a[1], **conv_keys(ctx)
            ),
            keys=CONV_KEYS,
            autocasts=True,
            rank=like(2, "w"),
            doc=f"the gradient of {_name}'s W: X correlated with G",
            internal=True,
        )
    )


def _transposed_shape(spatial: int):
    """torch's output length: (L - 1) s - 2p + d (k - 1) + output_padding + 1; the
    channels W's second axis times :groups."""

    def shape(shapes, attrs):
        x, w = shapes[:2]
        if x is None or len(x) not in (spatial + 1, spatial + 2):
            return None
        groups = known(attrs["groups"])
        out = None if w is None or None in (w[1], groups) else w[1] * groups
        kernels = (None,) * spatial if w is None else w[-spatial:]
        sizes = zip(
            x[-spatial:],
            kernels,
            *(
                _per_axis(attrs[k], spatial)
                for k in ("stride", "padding", "dilation", "output-padding")
            ),
        )
        made = tuple(
            (
                None
                if None in s
                else (s[0] - 1) * s[2] - 2 * s[3] + s[4] * (s[1] - 1) + s[5] + 1
            )
            for s in sizes
        )
        return x[: len(x) - spatial - 1] + (out,) + made

    return shape


def _transposed_grad(spatial: int):
    def grad(t, n, g):
        """The adjoint of a convolution: dX is the convolution of G by W with the same
        keys, dW torch.nn.grad's weight gradient of that convolution (G its input, X its
        output's gradient), dBIAS as a convolution's."""
        keys = {k: n.attrs[k] for k in ("stride", "padding", "dilation", "groups")}
        x, w = n.inputs[:2]
        forward = f"conv{spatial}d"
        grads = [
            t.op(forward, [g, w], **keys),
            t.op(f"{forward}-weight-grad", [g, x, w], **keys),
        ]
        return grads + _bias_grad(t, n, g, spatial)

    return grad


for _spatial in (1, 2):
    _name = f"conv-transpose{_spatial}d"
    _layout = "[N, C, L]" if _spatial == 1 else "[N, C, H, W]"
    _kernel = "[C, O/groups, K]" if _spatial == 1 else "[C, O/groups, KH, KW]"
    register(
        Op(
            _name,
            (Arg("x", "matrix"), Arg("w", "matrix"), Arg("bias", "matrix")),
            lambda a, ctx, f=f"F.conv_transpose{_spatial}d": b.call(
                f,
                *a,
                **conv_keys(ctx),
                **{
                    "output_padding": v
                    for v in given(ctx, "output-padding", 0).values()
                },
            ),
            keys=(
                Key("stride", "sizes", 1),
                Key("padding", "sizes", 0),
                Key("dilation", "sizes", 1),
                Key("groups", "int", 1),
                Key("output-padding", "sizes", 0),
            ),
            arity=(2, 3),
            grad=_transposed_grad(_spatial),
            autocasts=True,
            rank=RankRule(
                "X's, the channels W's second axis times :groups",
                _transposed_shape(_spatial),
            ),
            cached=sequence.spatial("convolves", _spatial, channels=True),
            doc=(
                f"F.conv_transpose{_spatial}d of X {_layout} (or unbatched) by W "
                f"{_kernel} (torch's layout: the input channels first), plus BIAS [O] "
                "if given: :stride, :padding, :dilation and :output-padding are an "
                "integer or one per spatial axis, :groups splits the channels. One "
                "kernel, as a convolution: f32 accumulation, rounded once to the dtype it "
                f"computes in. Its derivative rule is conv{_spatial}d of G by W and "
                f"torch.nn.grad's conv{_spatial}d_weight of G and X"
            ),
        )
    )


def _pool_shape(spatial: int):
    def shape(shapes, attrs):
        (x,) = shapes
        if x is None or len(x) < spatial + 1:
            return None
        kernel = _per_axis(attrs["kernel"], spatial)
        stride = (
            kernel if attrs["stride"] is None else _per_axis(attrs["stride"], spatial)
        )
        sizes = zip(x[-spatial:], kernel, stride, _per_axis(attrs["padding"], spatial))
        return x[:-spatial] + tuple(_window(*s, 1) for s in sizes)

    return shape


def _pool(torch_name: str):
    def emit(a, ctx):
        extra = {"stride": _sizes(ctx.attrs["stride"])} if ctx.attrs["stride"] else {}
        extra.update(given(ctx, "padding", 0))
        return b.call(torch_name, a[0], _sizes(ctx.attrs["kernel"]), **extra)

    return emit


POOL_KEYS = (
    Key("stride", "sizes"),
    Key("padding", "sizes", 0),
)
for _spatial in (1, 2):
    for _kind, _what in (("max", "the largest"), ("avg", "the mean")):
        _name = f"{_kind}-pool{_spatial}d"
        register(
            Op(
                _name,
                (Arg("x"), Arg("kernel", "sizes")),
                _pool(f"F.{_kind}_pool{_spatial}d"),
                keys=POOL_KEYS,
                result="keep" if _kind == "max" else "float",
                exact=_kind == "max",
                no_grad=NO_GRAD,
                rank=RankRule("same as X", _pool_shape(_spatial)),
                cached=sequence.spatial("pools", _spatial, channels=False),
                doc=(
                    f"F.{_kind}_pool{_spatial}d: {_what} of each KERNEL window of the last "
                    f"{_spatial} ax{'is' if _spatial == 1 else 'es'}; :stride defaults to "
                    "KERNEL, :padding to 0"
                    + (
                        " (padded with -inf)"
                        if _kind == "max"
                        else " (zeros, counted in the mean); one rounding under bf16"
                    )
                ),
            )
        )


def _interpolate_shape(shapes, attrs):
    (x,) = shapes
    if x is None or len(x) < 3:
        return None
    spatial = len(x) - 2
    if attrs["size"] is None:
        return x[:2] + (None,) * spatial
    return x[:2] + _per_axis(attrs["size"], spatial)


def _interpolate(a, ctx):
    extra = {}
    if ctx.attrs["size"] is not None:
        extra["size"] = _sizes(ctx.attrs["size"])
    if ctx.attrs["scale-factor"] is not None:
        extra["scale_factor"] = ctx.attrs["scale-factor"]
    if ctx.attrs["mode"] not in (None, "nearest"):
        extra["mode"] = b.string(ctx.attrs["mode"])
    if ctx.values["align-corners"] is SYMBOLIC or value(ctx.values["align-corners"]):
        extra["align_corners"] = ctx.attrs["align-corners"]
    return b.call("F.interpolate", a[0], **extra)


register(
    Op(
        "interpolate",
        (Arg("x"),),
        _interpolate,
        keys=(
            Key("size", "sizes"),
            Key("scale-factor", "number"),
            Key("mode", "mode"),
            Key("align-corners", "bool", False),
        ),
        no_grad=NO_GRAD,
        rank=RankRule("same as X", _interpolate_shape),
        cached=sequence.spatial("interpolates", None, channels=False),
        doc=(
            "F.interpolate of X [N, C, ...] to :size (an integer or one per spatial axis) "
            "or by :scale-factor; :mode :nearest (the default: picks input elements) or "
            ":bilinear (4-d X; :align-corners as torch's). Bilinear rounds once under bf16"
        ),
    )
)
