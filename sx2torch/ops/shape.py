"""Shape ops: they move data and keep its dtype."""

from typing import Optional

import libcst as cst

import sx2torch.build as b
from sx2torch.ir import Scalar
import sx2torch.ops.sequence as sequence
from sx2torch.ops import sharding
from sx2torch.ops.registry import SYMBOLIC, Arg, Key, Op, register
from sx2torch.syntax import scalars
from sx2torch.syntax.scalars import ScalarOp
from sx2torch.ops.rank import (
    AT,
    LEN,
    CONCAT,
    FLATTEN,
    REPEAT_INTERLEAVE,
    ROLL,
    PAD,
    STACK,
    SQUEEZE,
    UNSQUEEZE,
    ONE_HOT,
    RESHAPE,
    SAME,
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
    the first two axes and flattens the rest, `x.flatten(2)`, which reads no size; a first
    `...` keeps every axis but the last, `x.reshape(*x.shape[:-1], 2, -1)`."""
    if ctx.values["shape"][:1] == ("...",):
        lead = b.subscript(b.attr(a[0], "shape"), b.slice_(None, b.number(-1)))
        return b.method(a[0], "reshape", b.star(lead), *ctx.attrs["shape"][1:])
    kept = _flattened_from(ctx.values["shape"], ctx.ranks[0])
    if kept is not None:
        return b.method(a[0], "flatten", b.number(kept))
    if _appends_one(ctx.values["shape"], ctx.ranks[0]):
        return b.method(a[0], "unsqueeze", b.number(-1))
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


def _appends_one(values: tuple, rank) -> bool:
    """Whether a reshape keeps every axis of an input of a known rank (`0` at its place, or
    one `-1`, which can only be the axis left) and appends one of size 1: exactly
    `unsqueeze(-1)`, which reads no size. (Two or more appended stay `reshape(-1, 1, 1)`,
    the usual spelling of a channel's broadcast.)"""
    if rank is None or len(values) != rank + 1 or values[-1] != 1:
        return False
    kept = values[:rank]
    return all(v in (0, -1) for v in kept) and list(kept).count(-1) <= 1


def _reads_sizes(node) -> bool:
    """Whether a reshape's code reads its input's sizes, so that the input is a local."""
    values = tuple(
        v.value if v.op is ScalarOp.LIT else SYMBOLIC for v in node.attrs["shape"]
    )
    if values[:1] == ("...",):
        return True
    rank = rank_of(node.inputs[0])
    if _appends_one(values, rank):
        return False
    return _flattened_from(values, rank) is None and 0 in values


def _reshape_grad(t, n, g):
    return [t.op("reshape-as", [g, n.inputs[0]])]


def _transpose_grad(t, n, g):
    perm = [p.value for p in n.attrs["perm"]]
    inverse = tuple(Scalar.lit(perm.index(i)) for i in range(len(perm)))
    return [t.op("transpose", [g], perm=inverse)]


register(
    Op(
        "reshape",
        (X, Arg("shape", "shape")),
        _reshape,
        doc="X with the sizes of SHAPE (integers, consts, &key arguments, run-time sizes): "
        "-1 (at most once) is the size the others leave, and 0 keeps X's size at that "
        "position, as ONNX Reshape does (torch's 0 is an empty axis): (reshape x [0 0 -1 "
        "hd]) splits the last axis of [B T D] into heads, written x.reshape(x.shape[0], "
        "x.shape[1], -1, hd); [0 0 -1] keeps two axes and flattens the rest, "
        "x.flatten(2), and [0 0 -1 1] of a rank-3 X, which appends an axis of size 1, "
        "x.unsqueeze(-1) (where X's rank is known). A first `...` keeps every axis but "
        "the last: (reshape x [... -1 2]) "
        "is x.reshape(*x.shape[:-1], -1, 2). A 0 past X's axes, beside `...`, or after "
        "another size where the rank changes (so that its place is not that axis's: "
        "[1 0 0 0 -1] meant as an unsqueeze) is a diagnostic",
        result="keep",
        exact=True,
        name_inputs=_reads_sizes,
        grad=_reshape_grad,
        rank=RESHAPE,
        shards=sharding.reshape,
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
        shards=sharding.transpose,
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
        cached=sequence.moved("concatenates", sequence.one_axis),
        shards=sharding.along("axis"),
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


def _stack_grad(t, n, g):
    """Each input's gradient is its slice of G along the new axis, that axis dropped."""
    axis = n.attrs["axis"]
    return [
        t.op(
            "squeeze",
            [t.op("slice", [g], axis=axis, start=Scalar.lit(i), end=Scalar.lit(i + 1))],
            axis=axis,
        )
        for i in range(len(n.inputs))
    ]


register(
    Op(
        "stack",
        (Arg("xs", "tensors"),),
        lambda a, ctx: b.call("torch.stack", b.list_(a), dim=ctx.attrs["axis"]),
        keys=(Key("axis", "int", 0, static=True),),
        rank=STACK,
        result="keep",
        exact=True,
        grad=_stack_grad,
        doc="torch.stack: the tensors of XS, of one shape, along a new axis at :axis "
        "(default 0; -1 is after the last); moves data, rounding nowhere. Its derivative "
        "gives each its slice of the gradient",
    )
)


def _pad(a, ctx):
    value = ctx.values["value"]
    extra = {} if value == 0 else {"value": ctx.attrs["value"]}
    return b.call("F.pad", a[0], b.tuple_(list(ctx.attrs["padding"])), **extra)


def _pad_grad(t, n, g):
    """torch's: the gradient trimmed back, F.pad by the negated amounts."""
    back = tuple(scalars.negate(p, n.span) for p in n.attrs["padding"])
    return [t.op("pad", [g], padding=back)]


register(
    Op(
        "pad",
        (X, Arg("padding", "ints")),
        _pad,
        keys=(Key("value", "number", 0.0),),
        rank=PAD,
        result="keep",
        grad=_pad_grad,
        cached=sequence.moved("pads", sequence.padded),
        doc="F.pad in constant mode: PADDING is [left right] for the last axis, then for "
        "the one before, ... (a negative amount trims), the new places :value (default "
        "0); under :bf16 a bf16 tensor holds :value rounded, as torch's does. Its "
        "derivative trims the gradient back",
    )
)


def _slice(a, ctx):
    axis = ctx.values["axis"]
    start, end, step = ctx.attrs["start"], ctx.attrs["end"], ctx.attrs["step"]
    span = b.slice_(
        None if ctx.values["start"] == 0 else start,
        end,
        None if ctx.values["step"] == 1 else step,
    )
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
            Key("step", "int", 1),
        ),
        result="keep",
        exact=True,
        grad=lambda t, n, g: [t.op("slice-backward", [g, n.inputs[0]], **n.attrs)],
        rank=SLICE,
        cached=sequence.slice_,
        sequence=sequence.sliced,
        shards=sharding.along("axis"),
        doc="X[..., start:end:step] along :axis (default 0); :step (default 1) is positive, "
        "as torch's; a view",
    )
)


def _reshape_back(t, n, g):
    """A view that only regroups axes: its gradient is G regrouped as X."""
    return [t.op("reshape-as", [g, n.inputs[0]])]


def _view(name: str, emit, keys: tuple, grad, rank, doc: str, cached=None) -> None:
    """A view of X: it moves data, so it keeps X's dtype and bits (integers too)."""
    register(
        Op(
            name,
            (X,),
            emit,
            keys=keys,
            result="keep",
            exact=True,
            grad=grad,
            rank=rank,
            cached=cached,
            doc=doc + "; a view",
        )
    )


AXIS = Key("axis", "int", static=True)


def _squeeze(a, ctx):
    axis = ctx.attrs["axis"]
    return b.method(a[0], "squeeze", *([] if axis is None else [axis]))


def _flatten(a, ctx):
    start, end = ctx.values["start"], ctx.values["end"]
    args = [] if start == 0 else [ctx.attrs["start"]]
    if end != -1:
        args = [ctx.attrs["start"], ctx.attrs["end"]]
    return b.method(a[0], "flatten", *args)


def _repeat_interleave(a, ctx):
    axis = ctx.attrs["axis"]
    dim = {} if axis is None else {"dim": axis}
    return b.method(a[0], "repeat_interleave", ctx.attrs["repeats"], **dim)


def _repeat_interleave_grad(t, n, g):
    keys = {k: n.attrs[k] for k in ("repeats", "axis")}
    return [t.op("repeat-interleave-backward", [g, n.inputs[0]], **keys)]


def _roll(a, ctx):
    axis = ctx.attrs["axis"]
    dims = {} if axis is None else {"dims": axis}
    return b.call("torch.roll", a[0], ctx.attrs["shifts"], **dims)


def _roll_grad(t, n, g):
    back = scalars.negate(n.attrs["shifts"], n.span)
    return [t.op("roll", [g], shifts=back, axis=n.attrs["axis"])]


_view(
    "unsqueeze",
    lambda a, ctx: b.method(a[0], "unsqueeze", ctx.attrs["axis"]),
    (AXIS,),
    _reshape_back,
    UNSQUEEZE,
    "x.unsqueeze(axis): a new axis of size 1 at :axis (needed; -1 is after the last)",
)
_view(
    "squeeze",
    _squeeze,
    (AXIS,),
    _reshape_back,
    SQUEEZE,
    "x.squeeze(axis): drops :axis, of size 1 (a known other size is a diagnostic; torch "
    "would keep it); without :axis every axis of size 1",
)
_view(
    "flatten",
    _flatten,
    (Key("start", "int", 0, static=True), Key("end", "int", -1, static=True)),
    _reshape_back,
    FLATTEN,
    "torch.flatten: the axes :start to :end (both included; defaults 0 and -1) made one",
)
_view(
    "contiguous",
    lambda a, ctx: b.method(a[0], "contiguous"),
    (),
    lambda t, n, g: [g],
    SAME,
    "x.contiguous(): X's values, laid out row-major; a product's bits depend on its "
    "operands' layout, so a port writes it where the real code does (Whisper's "
    "attention: query, keys and values made contiguous before their products gives "
    "transformers' f32 logits bit for bit, a permuted view of them does not). Its "
    "derivative is the gradient as it is",
)
_view(
    "repeat-interleave",
    _repeat_interleave,
    (Key("repeats", "int"), AXIS),
    _repeat_interleave_grad,
    REPEAT_INTERLEAVE,
    "x.repeat_interleave(repeats, dim=axis): each slice along :axis :repeats times in a "
    "row (grouped-query attention's heads); without :axis, the flattened elements. Its "
    "derivative sums each run of :repeats gradients (one sum, rounded once, as torch's)",
    cached=sequence.moved("repeats", sequence.one_axis),
)
_view(
    "roll",
    _roll,
    (Key("shifts", "int", 0), AXIS),
    _roll_grad,
    ROLL,
    "torch.roll(x, shifts, axis): the elements moved :shifts places along :axis, those "
    "past the end coming round to the start (Swin's shifted windows); without :axis, of "
    "the flattened elements. Its derivative rolls back",
    cached=sequence.moved("rolls", sequence.one_axis),
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
        numbers=lambda operands, span, i: scalars.element([*operands, i], span),
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
        "len",
        (Arg("x", "like"),),  # read for its first axis's size alone
        lambda a, ctx: b.call("len", a[0]),
        result="int",
        python_number=True,
        numbers=scalars.length,
        no_grad="integers carry no gradient",
        rank=LEN,
        doc="len(X): of a list const or &key, its length, known when the module is built "
        "(`(stack (i (len depths)) ...)`); of a tensor, the size of its first axis when "
        "the module runs, a Python integer as `size`'s",
    )
)


def _take(a, ctx):
    """`table[ids]`; with a :padding-idx (a literal, or a const the caller may set to
    None), torch's embedding, whose derivative leaves that row's gradient zero."""
    if ctx.attrs["padding-idx"] is None:
        return b.subscript(a[0], a[1])
    return b.call("F.embedding", a[1], a[0], padding_idx=ctx.attrs["padding-idx"])


def _take_grad(t, node, g):
    padding = node.attrs["padding-idx"]
    return [t.op("take-backward", [g, *node.inputs], **{"padding-idx": padding}), None]


register(
    Op(
        "take",
        (Arg("table"), Arg("ids", "ids")),
        _take,
        keys=(Key("padding-idx", "row"),),
        result="keep",
        exact=True,
        grad=_take_grad,
        rank=TAKE,
        gathers=True,
        doc="row gather: an embedding lookup, `table[ids]`; with :padding-idx P (an "
        "integer, negative from the end, or a const whose default is none), "
        "F.embedding(ids, table, padding_idx=P), TABLE a matrix: the same rows, and its "
        "derivative, torch's embedding backward, leaves row P's gradient zero",
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
