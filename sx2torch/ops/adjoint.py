"""Ops that derivative rules build the backward from (they are ordinary ops, usable in source too)."""

import sx2torch.build as b
from sx2torch.errors import SourceError
from sx2torch.ops.registry import Arg, Key, Op, register
from sx2torch.ops.rank import CONCAT_PART, MATMUL, SCALAR, like

G, LIKE = Arg("g"), Arg("like", "like")
LIKE_SHAPE = like(1, "like")


def _sum_to_grad(t, node, g):
    return [t.op("expand-as", [g, node.inputs[0]]), None]


def _expand_as_grad(t, node, g):
    return [t.op("sum-to", [g, node.inputs[0]]), None]


def _filled(torch_name: str):
    """ones or zeros shaped like the input, in the dtype the node computes in."""

    def emit(a, ctx):
        return b.call(torch_name, a[0], dtype=b.dotted(ctx.tensor_dtype))

    return emit


register(
    Op(
        "ones-like",
        (LIKE,),
        _filled("torch.ones_like"),
        rank=like(0, "like"),
        grad=lambda t, n, g: [None],
        exact=True,
        fills=True,
        constant=True,
        ones=True,
    )
)
register(
    Op(
        "zeros-like",
        (LIKE,),
        _filled("torch.zeros_like"),
        rank=like(0, "like"),
        grad=lambda t, n, g: [None],
        exact=True,
        fills=True,
        constant=True,
    )
)
register(
    Op(
        "mean-ones",
        (LIKE,),
        lambda a, ctx: b.binop(
            _filled("torch.ones_like")(a, ctx), "/", b.method(a[0], "numel")
        ),
        rank=like(0, "like"),
        grad=lambda t, n, g: [None],
        doc="ones shaped like `like` over its number of elements: the gradient of its mean over all axes",
        name_inputs=True,
        internal=True,
    )
)


def _matmul_ones(a, ctx):
    """`x.new_ones(x.shape[:-1] + w.shape[-1:])`: the shape of torch.matmul(x, w) for a
    matrix w, whatever x's rank."""
    x, w = a
    shape = b.binop(
        b.subscript(b.attr(x, "shape"), b.slice_(None, b.number(-1))),
        "+",
        b.subscript(b.attr(w, "shape"), b.slice_(b.number(-1), None)),
    )
    return b.method(x, "new_ones", shape, dtype=b.dotted(ctx.tensor_dtype))


register(
    Op(
        "matmul-ones",
        (Arg("x", "like"), Arg("w", "like")),
        _matmul_ones,
        rank=MATMUL,
        grad=lambda t, n, g: [None, None],
        exact=True,
        doc="ones shaped as (matmul x w) for a matrix w, made without computing it",
        name_inputs=True,
        constant=True,
        internal=True,
    )
)


def _sum_to(a, ctx):
    """`g.sum_to_size(like.shape)`; a full sum where `like` is 0-d, whose shape is known."""
    if ctx.ranks and ctx.ranks[1] == 0:
        return b.method(a[0], "sum")
    return b.method(a[0], "sum_to_size", b.attr(a[1], "shape"))


register(
    Op(
        "sum-to",
        (G, LIKE),
        _sum_to,
        grad=_sum_to_grad,
        rank=LIKE_SHAPE,
        doc="sums a broadcast gradient back to the shape of `like`",
        internal=True,
    )
)
register(
    Op(
        "expand-as",
        (G, LIKE),
        lambda a, ctx: b.method(a[0], "expand_as", a[1]),
        grad=_expand_as_grad,
        rank=LIKE_SHAPE,
        result="keep",
        exact=True,
        spread=lambda inputs, attrs: ("ones-like", inputs[1]),
        doc="broadcasts to the shape of `like`; an integer or boolean tensor stays one",
    )
)


def _unsqueezed(g: b.Expr, axes, keepdims: bool) -> b.Expr:
    """Put back the axes a reduction removed: non-negative ones first, then negative from the end."""
    if keepdims or axes is None:
        return g
    for axis in sorted(a for a in axes if a >= 0):
        g = b.method(g, "unsqueeze", b.number(axis))
    for axis in sorted((a for a in axes if a < 0), reverse=True):
        g = b.method(g, "unsqueeze", b.number(axis))
    return g


def _expand_reduced(a, ctx):
    """The gradient of a sum (or mean) over `axes`: broadcast back over them (and divided by their size)."""
    g, x = a
    expanded = b.method(
        _unsqueezed(g, ctx.values["axes"], ctx.values["keepdims"]), "expand_as", x
    )
    if not ctx.values["mean"]:
        return expanded
    count = b.binop(b.method(x, "numel"), "/", b.method(g, "numel"))
    return b.binop(expanded, "/", count)


def _expand_reduced_grad(t, node, g):
    reduce = "mean" if node.attrs["mean"].value else "sum"
    return [
        t.op(reduce, [g], axes=node.attrs["axes"], keepdims=node.attrs["keepdims"]),
        None,
    ]


def _spread_reduced(inputs, attrs):
    """Ones spread back over a sum's axes are ones of its input's shape; over all of a
    mean's axes, those ones over their number."""
    if not attrs["mean"].value:
        return "ones-like", inputs[1]
    if attrs["axes"] is None:
        return "mean-ones", inputs[1]
    return None


register(
    Op(
        "expand-reduced",
        (G, LIKE),
        _expand_reduced,
        keys=(
            Key("axes", "ints"),
            Key("keepdims", "bool", False),
            Key("mean", "bool", False),
        ),
        grad=_expand_reduced_grad,
        rank=LIKE_SHAPE,
        spread=_spread_reduced,
        name_inputs=True,
        internal=True,
    )
)


def _take_backward(a, ctx):
    padding = ctx.attrs["padding-idx"]
    if padding is None:
        return b.call("sx.take_backward", *a)
    return b.call("sx.take_backward", *a, padding_idx=padding)


def _take_backward_grad(t, node, g):
    if node.attrs["padding-idx"] is not None:
        raise SourceError(
            node.span,
            "a second derivative through take with :padding-idx is not supported yet",
        )
    return [t.op("take", [g, node.inputs[2]]), None, None]


register(
    Op(
        "take-backward",
        (G, LIKE, Arg("ids", "ids")),
        _take_backward,
        keys=(Key("padding-idx", "row"),),
        grad=_take_backward_grad,
        rank=LIKE_SHAPE,
        internal=True,
    )
)


def _slice_backward(a, ctx):
    values = ctx.values
    end = ctx.attrs["end"] if values["end"] is not None else b.name("None")
    step = [] if values["step"] == 1 else [ctx.attrs["step"]]
    return b.call(
        "sx.slice_backward",
        a[0],
        a[1],
        ctx.attrs["axis"],
        ctx.attrs["start"],
        end,
        *step,
    )


def _slice_backward_grad(t, node, g):
    attrs = {k: node.attrs[k] for k in ("axis", "start", "end", "step")}
    return [t.op("slice", [g], **attrs), None]


SLICE_KEYS = (Key("axis", "int", 0), Key("start", "int", 0), Key("end", "int"))
SLICE_KEYS += (Key("step", "int", 1),)
register(
    Op(
        "slice-backward",
        (G, LIKE),
        _slice_backward,
        keys=SLICE_KEYS,
        grad=_slice_backward_grad,
        rank=LIKE_SHAPE,
        exact=True,
        internal=True,
    )
)


def _concat_part(a, ctx):
    g, *parts = a
    return b.call(
        "sx.concat_part", g, b.list_(parts), ctx.attrs["index"], ctx.attrs["axis"]
    )


register(
    Op(
        "concat-part",
        (G, LIKE),
        _concat_part,
        keys=(Key("index", "int", 0), Key("axis", "int", 0)),
        exact=True,
        arity=(2, None),
        rank=CONCAT_PART,
        spread=lambda inputs, attrs: ("ones-like", inputs[1 + attrs["index"].value]),
        internal=True,
    )
)


def _expect_scalar(a, ctx):
    return b.call("sx.expect_scalar", a[0], b.string(ctx.values["form"]))


register(
    Op(
        "expect-scalar",
        (Arg("y"),),
        _expect_scalar,
        keys=(Key("form", "text"),),
        result="keep",
        exact=True,
        grad=lambda t, n, g: [g],
        rank=SCALAR,
        checks=True,
        doc="Y, checked to be 0-d when the module runs: the Y of a gradient whose rank the compiler cannot tell",
        internal=True,
    )
)


def _repeat_interleave_backward(a, ctx):
    """Each run of `repeats` gradients summed: G with the axis split as (-1, repeats),
    summed over the repeats (the axis after it, counted from the start; the axis itself,
    counted from the end); without an axis, the flattened elements', shaped as X."""
    g, repeats, axis = a[0], ctx.attrs["repeats"], ctx.values["axis"]
    if axis is None:
        rows = b.method(g, "reshape", b.number(-1), repeats)
        return b.method(
            b.method(rows, "sum", b.number(1)), "reshape", b.attr(a[1], "shape")
        )
    runs = b.method(
        g, "unflatten", ctx.attrs["axis"], b.tuple_([b.number(-1), repeats])
    )
    return b.method(runs, "sum", b.number(axis + 1 if axis >= 0 else axis))


def _repeat_interleave_backward_grad(t, node, g):
    keys = {k: node.attrs[k] for k in ("repeats", "axis")}
    return [t.op("repeat-interleave", [g], **keys), None]


register(
    Op(
        "repeat-interleave-backward",
        (G, LIKE),
        _repeat_interleave_backward,
        keys=(Key("repeats", "int"), Key("axis", "int", static=True)),
        grad=_repeat_interleave_backward_grad,
        rank=LIKE_SHAPE,
        name_inputs=lambda node: node.attrs["axis"] is None,
        internal=True,
    )
)
