"""Reductions over `:axes` (default: all axes), with `:keepdims`."""

from sx2torch.emit import build as b
from sx2torch.ops import Arg, Key, Op, register

AXES = (Key("axes", "ints"), Key("keepdims", "bool", False))


def dims(axes) -> b.Expr:
    return axes[0] if len(axes) == 1 else b.tuple_(list(axes))


def _reduction(name: str, torch_name: str, all_axes: b.Expr) -> None:
    def emit(a, ctx):
        axes, keepdims = ctx.attrs["axes"], ctx.values["keepdims"]
        if axes is None and not keepdims:
            return b.call(torch_name, a[0])
        dim = all_axes if axes is None else dims(axes)
        extra = {"keepdim": b.number(True)} if keepdims else {}
        return b.call(torch_name, a[0], dim=dim, **extra)

    register(Op(name, (Arg("x"),), emit, keys=AXES, result="keep" if name in ("amax", "amin") else "float"))


_reduction("sum", "torch.sum", b.name("None"))
_reduction("mean", "torch.mean", b.name("None"))
_reduction("amax", "torch.amax", b.tuple_([]))
_reduction("amin", "torch.amin", b.tuple_([]))
