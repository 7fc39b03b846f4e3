"""Shape ops: they move data and keep its dtype."""

from typing import Optional

import libcst as cst

import sx2torch.build as b
from sx2torch.ir import Scalar
from sx2torch.ops.registry import SYMBOLIC, Arg, Key, Op, register
from sx2torch.syntax.scalars import ScalarOp
from sx2torch.ops.rank import (
    AT,
    CONCAT,
    ONE_HOT,
    RESHAPE,
    SLICE,
    SWAP_AXES,
    TAKE,
    TRANSPOSE,
    like,
    rank_of,
)

X = Arg("x")


def _reshape(a, ctx):
    """`0` keeps the input's size at that position, as ONNX Reshape does; `[0 0 -1]` keeps
    the first two axes and flattens the rest, `x.flatten(2)`, which reads no size."""
    kept = _flattened_from(ctx.values["shape"], ctx.ranks[0])
    if kept is not None:
        return b.method(a[0], "flatten", b.number(kept))
    sizes = [
        b.subscript(b.attr(a[0], "shape"), b.number(i)) if value == 0 else expr
        for i, (expr, value) in enumerate(zip(ctx.attrs["shape"], ctx.values["shape"]))
    ]
    return b.method(a[0], "reshape", *sizes)


def _flattened_from(values: tuple, rank) -> Optional[int]:
    """The axis a reshape flattens from, where it keeps its leading axes (`0`) and flattens
    the rest (a last `-1`) of an input of a known rank with more axes than it keeps."""
    kept = next((i for i, v in enumerate(values) if v != 0), len(values))
    if kept and values[kept:] == (-1,) and rank is not None and rank > kept:
        return kept
    return None


def _reads_sizes(node) -> bool:
    """Whether a reshape's code reads its input's sizes, so that the input is a local."""
    values = tuple(
        v.value if v.op is ScalarOp.LIT else SYMBOLIC for v in node.attrs["shape"]
    )
    return _flattened_from(values, rank_of(node.inputs[0])) is None and 0 in values


def _reshape_grad(t, n, g):
    return [t.op("reshape-as", [g, n.inputs[0]])]


def _transpose_grad(t, n, g):
    perm = [p.value for p in n.attrs["perm"]]
    inverse = tuple(Scalar.lit(perm.index(i)) for i in range(len(perm)))
    return [t.op("transpose", [g], perm=inverse)]


register(
    Op(
        "reshape",
        (X, Arg("shape", "ints")),
        _reshape,
        result="keep",
        exact=True,
        name_inputs=_reads_sizes,
        grad=_reshape_grad,
        rank=RESHAPE,
    )
)
register(
    Op(
        "reshape-as",
        (X, Arg("like", "like")),
        lambda a, ctx: b.method(a[0], "reshape", b.attr(a[1], "shape")),
        result="keep",
        exact=True,
        grad=_reshape_grad,
        rank=like(1, "like"),
    )
)
register(
    Op(
        "transpose",
        (X, Arg("perm", "ints", static=True)),
        lambda a, ctx: b.method(a[0], "permute", *ctx.attrs["perm"]),
        result="keep",
        exact=True,
        grad=_transpose_grad,
        rank=TRANSPOSE,
    )
)
register(
    Op(
        "swap-axes",
        (X, Arg("a", "int"), Arg("b", "int")),
        lambda a, ctx: b.method(a[0], "transpose", ctx.attrs["a"], ctx.attrs["b"]),
        result="keep",
        exact=True,
        grad=lambda t, n, g: [t.op("swap-axes", [g], a=n.attrs["a"], b=n.attrs["b"])],
        rank=SWAP_AXES,
    )
)
register(
    Op(
        "concat",
        (Arg("xs", "tensors"),),
        lambda a, ctx: b.call("torch.cat", b.list_(a), dim=ctx.attrs["axis"]),
        keys=(Key("axis", "int", 0),),
        rank=CONCAT,
        result="keep",
        exact=True,
        grad=lambda t, n, g: [
            t.op(
                "concat-part", [g, *n.inputs], index=Scalar.lit(i), axis=n.attrs["axis"]
            )
            for i in range(len(n.inputs))
        ],
    )
)


def _slice(a, ctx):
    axis = ctx.values["axis"]
    start, end = ctx.attrs["start"], ctx.attrs["end"]
    span = b.slice_(None if ctx.values["start"] == 0 else start, end)
    whole = b.slice_(None, None)
    if axis >= 0:
        index = [whole] * axis + [span]
    else:
        index = [cst.Ellipsis(), span] + [whole] * (-axis - 1)
    elements = [
        cst.SubscriptElement(i if isinstance(i, cst.Slice) else cst.Index(i))
        for i in index
    ]
    return cst.Subscript(b.at_least(a[0], b.ATOM), elements)


register(
    Op(
        "slice",
        (X,),
        _slice,
        keys=(
            Key("axis", "int", 0, static=True),
            Key("start", "int", 0),
            Key("end", "int"),
        ),
        result="keep",
        exact=True,
        grad=lambda t, n, g: [t.op("slice-backward", [g, n.inputs[0]], **n.attrs)],
        rank=SLICE,
    )
)
register(
    Op(
        "at",
        (X, Arg("i", "int")),
        lambda a, ctx: b.subscript(a[0], ctx.attrs["i"]),
        result="keep",
        exact=True,
        rank=AT,
        no_grad="no derivative rule yet",
        doc="X[I], I a number known when the module runs (a const, a key, the layer index): "
        "an element of a vector is a 0-d tensor (a row of a matrix is not), which decides no "
        "dtype beside a tensor with axes (torch's type promotion) and is read in the dtype "
        "its op computes in, either operand, as a GPU's kernel converts a 0-d tensor that is "
        "not a CPU scalar to the op's dtype as it loads it: cuda writes an f32 first operand "
        "as it is (`lam * x`) and a later one with its cast (`x * lam.to(torch.bfloat16)`), "
        "which torch's CPU kernel would read as a scalar, in f32; metal and cpu round it "
        "with sx.round_to_bf16",
    )
)
register(
    Op(
        "take",
        (Arg("table"), Arg("ids", "ids")),
        lambda a, ctx: b.subscript(a[0], a[1]),
        result="keep",
        exact=True,
        grad=lambda t, n, g: [t.op("take-backward", [g, *n.inputs]), None],
        rank=TAKE,
        gathers=True,
        doc="row gather: an embedding lookup",
    )
)


def _one_hot(a, ctx):
    codes = b.call("F.one_hot", a[0], ctx.attrs["n"])
    return b.method(codes, "to", b.dotted(ctx.tensor_dtype))


register(
    Op(
        "one-hot",
        (Arg("ids", "ids"), Arg("n", "int")),
        _one_hot,
        grad=lambda t, n, g: [None],
        rank=ONE_HOT,
        doc="float codes in the compute dtype",
    )
)
