"""Tensors made when the module runs: positions and tables, such as rotary angles.

Each reads a tensor (LIKE) only for its size or its device, so a sequence length is
never pinned to a constant. Their values are new: no float input decides their dtype,
so they are f32 under either policy (bf16 only inside a `(:precision :bf16)` region),
and no gradient flows through them.
"""

import sx2torch.build as b
import sx2torch.ops.sequence as sequence
from sx2torch.ops.registry import Arg, Key, Op, register
from sx2torch.ops.rank import SCALAR, RankRule, ShapeError, known

ARANGE_OF = RankRule(
    "1", lambda shapes, attrs: (_size(shapes[0], known(attrs["axis"])),)
)


def _steps(shapes, attrs):
    steps = known(attrs["steps"])
    # torch.linspace refuses it when the module runs
    if steps is not None and steps < 0:
        raise ShapeError(f"linspace's steps must not be negative, got {steps}")
    return (steps,)


LINSPACE = RankRule("1", _steps)
ARANGE = RankRule("1", lambda shapes, attrs: (_count(attrs),))


def _count(attrs):
    """torch.arange's length, ceil((end - start) / step), where all three are literals;
    a step of 0, or one away from END, torch refuses when the module runs."""
    start, end, step = (known(attrs[k]) for k in ("start", "end", "step"))
    if step == 0:
        raise ShapeError("arange's step must not be 0")
    if None in (start, end, step):
        return None
    if (end - start) * step < 0:
        raise ShapeError(
            f"arange from {start} to {end} by {step}: the step goes away from the end"
        )
    return -((start - end) // step)


def _size(shape, axis):
    """LIKE's size along a literal axis, where known."""
    if shape is None or axis is None or not -len(shape) <= axis < len(shape):
        return None
    return shape[axis]


LIKE = Arg("like", "like")


def _arange_of(a, ctx):
    size = b.subscript(b.attr(a[0], "shape"), ctx.attrs["axis"])
    return b.call(
        "torch.arange",
        size,
        dtype=b.dotted(ctx.tensor_dtype),
        device=b.attr(a[0], "device"),
    )


register(
    Op(
        "arange-of",
        (LIKE,),
        _arange_of,
        keys=(Key("axis", "int", -1),),
        name_inputs=True,
        grad=lambda t, n, g: [None],
        cached=sequence.positions("cached-arange-of"),
        doc=(
            "0, 1, ..., n-1 with n LIKE's size along :axis when the module runs (positions); "
            "f32 unless in a bf16 region, where bf16 holds integers exactly only up to 256"
        ),
        rank=ARANGE_OF,
    )
)


def _positions(a, ctx):
    size = b.subscript(b.attr(a[0], "shape"), ctx.attrs["axis"])
    return b.call("torch.arange", size, device=b.attr(a[0], "device"))


register(
    Op(
        "positions",
        (LIKE,),
        _positions,
        keys=(Key("axis", "int", -1),),
        name_inputs=True,
        result="int",
        no_grad="integers carry no gradient",
        cached=sequence.positions("cached-positions"),
        doc=(
            "0, 1, ..., n-1 as integers (int64), n LIKE's size along :axis when the module "
            "runs: positions for `take`, as `(take wpe (positions ids :axis 1))`; exact"
        ),
        rank=ARANGE_OF,
    )
)
register(
    Op(
        "size",
        (LIKE,),
        lambda a, ctx: b.subscript(b.attr(a[0], "shape"), ctx.attrs["axis"]),
        keys=(Key("axis", "int", -1),),
        result="int",
        python_number=True,
        no_grad="integers carry no gradient",
        cached=sequence.size,
        doc=(
            "LIKE's size along :axis when the module runs, `x.shape[1]`: a Python integer, "
            "which decides no dtype beside a tensor (as a number does); it and Python "
            "arithmetic on it serve where torch takes an int: (slice y :end (- (size x "
            ":axis 1) 1)) is y[: x.shape[1] - 1]"
        ),
        rank=SCALAR,
    )
)
register(
    Op(
        "run-number",
        (Arg("value", "number"),),
        lambda a, ctx: a[0],
        result="int",
        python_number=True,
        internal=True,
        doc=(
            "VALUE, arithmetic on sizes known when the module runs, that a `let` "
            "names: a local of its own, `m = n - 2`, read by name as a size's "
            "`n = x.shape[1]` is, so that a chain of lets nests no expression deeper "
            "than one step (made by `let`, never written)"
        ),
        rank=SCALAR,
    )
)


def _on_device(function: str, *keys: str):
    """`torch.linspace(...)`, `torch.arange(...)`: the op's numbers, in the dtype it computes
    in, on LIKE's device."""

    def emit(a, ctx):
        return b.call(
            function,
            *(ctx.attrs[key] for key in keys),
            dtype=b.dotted(ctx.tensor_dtype),
            device=b.attr(a[0], "device"),
        )

    return emit


register(
    Op(
        "linspace",
        (LIKE, Arg("start", "number"), Arg("end", "number"), Arg("steps", "int")),
        _on_device("torch.linspace", "start", "end", "steps"),
        grad=lambda t, n, g: [None],
        doc=(
            "STEPS evenly spaced values from START to END (torch.linspace), on LIKE's device; "
            "f32 unless in a bf16 region"
        ),
        rank=LINSPACE,
    )
)


register(
    Op(
        "arange",
        (LIKE, Arg("start", "int"), Arg("end", "int"), Arg("step", "int")),
        _on_device("torch.arange", "start", "end", "step"),
        grad=lambda t, n, g: [None],
        doc=(
            "START, START + STEP, ... up to END excluded (torch.arange), on LIKE's device: "
            "rotary frequencies' exponents; f32 unless in a bf16 region"
        ),
        rank=ARANGE,
    )
)
