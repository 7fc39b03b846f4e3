"""Reductions over `:axes` (default: all axes), with `:keepdims`."""

import sx2torch.build as b
from sx2torch.ir import Scalar
from sx2torch.ops.registry import Arg, Key, Op, along, register
from sx2torch.ops.rank import REDUCED

AXES = (
    Key("axes", "ints", static=True),
    Key("keepdims", "bool", False, static=True),
)


def dims(axes) -> b.Expr:
    return axes[0] if len(axes) == 1 else b.tuple_(list(axes))


def _spread(t, n, g, mean: bool = False):
    """The output's gradient broadcast back over the reduced axes."""
    x = n.inputs[0]
    return t.op(
        "expand-reduced",
        [g, x],
        axes=n.attrs["axes"],
        keepdims=n.attrs["keepdims"],
        mean=Scalar.lit(mean),
    )


def _extremum_grad(t, n, g):
    """torch's rule: the gradient is shared evenly by the elements equal to the extremum."""
    x = n.inputs[0]
    hits = t.op(
        "where",
        [t.op("=", [x, _spread(t, n, n)]), t.op("ones-like", [x]), Scalar.lit(0.0)],
    )
    count = _spread(
        t, n, t.op("sum", [hits], axes=n.attrs["axes"], keepdims=n.attrs["keepdims"])
    )
    return [t.op("/", [t.op("*", [_spread(t, n, g), hits]), count])]


GRADS = {
    "sum": lambda t, n, g: [_spread(t, n, g)],
    "mean": lambda t, n, g: [_spread(t, n, g, mean=True)],
    "amax": _extremum_grad,
    "amin": _extremum_grad,
}


def _reduction(name: str, torch_name: str, all_axes: b.Expr, doc: str = "") -> None:
    def emit(a, ctx):
        axes, keepdims = ctx.attrs["axes"], ctx.values["keepdims"]
        if axes is None and not keepdims:
            return b.call(torch_name, a[0])
        dim = all_axes if axes is None else dims(axes)
        extra = {"keepdim": b.number(True)} if keepdims else {}
        return b.call(torch_name, a[0], dim=dim, **extra)

    result = {"amax": "keep", "amin": "keep", "sum": "sum"}.get(name, "float")
    exact = name in ("amax", "amin")
    register(
        Op(
            name,
            (Arg("x"),),
            emit,
            keys=AXES,
            result=result,
            grad=GRADS[name],
            exact=exact,
            rank=REDUCED,
            mixes=along("axes"),
            # a sum over every axis (mean's gradient is ones over their number)
            total=(lambda attrs: attrs["axes"] is None) if name == "sum" else False,
            doc=doc,
            bf16_risk=(
                ""
                if exact
                else "reduces in bf16, which loses the small terms of a long sum"
            ),
        )
    )


_reduction(
    "sum",
    "torch.sum",
    b.name("None"),
    "of an integer or boolean tensor, an int64 sum (a count of the trues), never rounded, "
    "as torch's",
)
_reduction("mean", "torch.mean", b.name("None"))
_reduction("amax", "torch.amax", b.tuple_([]))
_reduction("amin", "torch.amin", b.tuple_([]))
