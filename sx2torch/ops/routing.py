"""Routing: choosing elements by value and moving them by index, as a mixture of experts'
router does (Mixtral's top-k): `topk`, `argmax`, `gather`, `index-select`, `scatter-add`,
`index-add`, `cumsum`. Indices are integer tensors (int64), never cast; each op's `:axis`
counts from 0 or from the end (default -1, index ops 0 where torch's examples index rows).
"""

import sx2torch.build as b
from sx2torch.ir import Scalar
from sx2torch.ops.rank import RankRule, known
from sx2torch.ops.registry import Arg, Key, Op, along, register

X, IDS, K = Arg("x"), Arg("index", "ids"), Arg("k", "int")
LAST = (Key("axis", "int", -1),)
ROWS = (Key("axis", "int", 0),)
NOT_DETERMINISTIC = (
    "the sum of several sources at one place is in the order the kernel meets them: "
    "fixed on a CPU, atomic (not the same bits run after run) on a GPU unless "
    "torch.use_deterministic_algorithms(True)"
)


def _axis(shape, attrs):
    """The literal axis counted from 0, or None."""
    axis = known(attrs["axis"])
    if shape is None or axis is None or not -len(shape) <= axis < len(shape):
        return None
    return axis % len(shape)


def _with_size(shape, attrs, size):
    axis = _axis(shape, attrs)
    if axis is None:
        return None if shape is None else (None,) * len(shape)
    return shape[:axis] + (size,) + shape[axis + 1 :]


def _dim(ctx) -> b.Expr:
    return ctx.attrs["axis"]


TOPK = RankRule(
    "X's, K along :axis", lambda s, attrs: _with_size(s[0], attrs, known(attrs["k"]))
)
INDEX_SHAPE = RankRule("INDEX's", lambda s, attrs: s[1])
ROWS_OF_INDEX = RankRule(
    "X's, INDEX's length along :axis",
    lambda s, attrs: _with_size(s[0], attrs, s[1][0] if s[1] else None),
)
DROPPED = RankRule(
    "X's - 1 (drops :axis)",
    lambda s, attrs: (
        None
        if _axis(s[0], attrs) is None
        else tuple(d for i, d in enumerate(s[0]) if i != _axis(s[0], attrs))
    ),
)
SAME = RankRule("same as X", lambda s, attrs: s[0])


SORTED = Key("sorted", "bool", True, static=True)


def _topk_indices(a, ctx):
    unsorted = {} if ctx.values["sorted"] else {"sorted": b.name("False")}
    call = b.call("torch.topk", a[0], ctx.attrs["k"], dim=_dim(ctx), **unsorted)
    return b.attr(call, "indices")


def _topk(t, inputs, attrs):
    """(topk X K): the indices from torch.topk, the values gathered at them, so the
    values are X's own elements (exact) and their gradient flows through the gather."""
    (x,) = inputs
    indices = t.op(
        "topk-indices", [x], k=attrs["k"], axis=attrs["axis"], sorted=attrs["sorted"]
    )
    return t.op("gather", [x, indices], axis=attrs["axis"]), indices


register(
    Op(
        "topk",
        (X, K),
        expand=_topk,
        keys=(*LAST, SORTED),
        rank=TOPK,
        doc=(
            "the K largest values along :axis and their indices, two values: "
            "`(let (([v i] (topk x 2))) ...)`, in torch.topk's order, ties broken as "
            "torch breaks them; traced as its indices and a `gather` of x at them, "
            "written as one `torch.topk(x, k, dim)` giving both (its values are those "
            "elements: the same bits, the same gradient but for a -0 it keeps where "
            "gather's backward adds it to +0). :sorted false is "
            "torch's sorted=False: the order its kernel leaves them in (a sum over them "
            "adds in that order, as DeepSeek's renormalisation does)"
        ),
    )
)
register(
    Op(
        "topk-indices",
        (X,),
        _topk_indices,
        keys=(Key("k", "int"), *LAST, SORTED),
        result="int",
        picked=True,
        internal=True,
        rank=TOPK,
    )
)
register(
    Op(
        "argmax",
        (X,),
        lambda a, ctx: b.call("torch.argmax", a[0], dim=_dim(ctx)),
        keys=LAST,
        result="int",
        no_grad="integers carry no gradient",
        rank=DROPPED,
        doc="the index of the largest value along :axis (the first of equal ones); int64",
    )
)


def _read_grad(add: str):
    """The gradient of a read at INDEX: its gradient added back at the places read."""

    def grad(t, node, g):
        x, index = node.inputs
        zeros = t.op("zeros-like", [x])
        return [t.op(add, [zeros, index, g], axis=node.attrs["axis"]), None]

    return grad


register(
    Op(
        "gather",
        (X, IDS),
        lambda a, ctx: b.call("torch.gather", a[0], _dim(ctx), a[1]),
        keys=LAST,
        result="keep",
        picks=True,
        exact=True,
        grad=_read_grad("scatter-add"),
        rank=INDEX_SHAPE,
        doc=(
            "X's elements at INDEX along :axis, `torch.gather(x, axis, index)`: "
            "shaped like INDEX; exact"
        ),
    )
)
register(
    Op(
        "index-select",
        (X, IDS),
        lambda a, ctx: b.call("torch.index_select", a[0], _dim(ctx), a[1]),
        keys=ROWS,
        result="keep",
        exact=True,
        grad=_read_grad("index-add"),
        rank=ROWS_OF_INDEX,
        doc=(
            "the slices of X at the 1-D INDEX along :axis (default 0: rows, "
            "`x[token_idx]`); exact"
        ),
    )
)
SRC = Arg("src")


def _added_grad(read: str):
    def grad(t, node, g):
        _, index, _ = node.inputs
        return [g, None, t.op(read, [g, index], axis=node.attrs["axis"])]

    return grad


register(
    Op(
        "scatter-add",
        (X, IDS, SRC),
        lambda a, ctx: b.method(a[0], "scatter_add", _dim(ctx), a[1], a[2]),
        keys=LAST,
        grad=_added_grad("gather"),
        rank=SAME,
        doc=(
            "X with each element of SRC added at its INDEX along :axis, "
            "`x.scatter_add(axis, index, src)`; each addition rounds to the compute "
            "dtype; " + NOT_DETERMINISTIC
        ),
    )
)
register(
    Op(
        "index-add",
        (X, IDS, SRC),
        lambda a, ctx: b.method(a[0], "index_add", _dim(ctx), a[1], a[2]),
        keys=ROWS,
        grad=_added_grad("index-select"),
        rank=SAME,
        doc=(
            "X with the slice k of SRC added at INDEX[k] along :axis (default 0: "
            "rows), `x.index_add(axis, index, src)`; each addition rounds to the "
            "compute dtype; " + NOT_DETERMINISTIC
        ),
    )
)


def _cumsum_grad(t, node, g):
    """The sum of g from each position to the end: the total less the prefix before it."""
    axis = node.attrs["axis"]
    total = t.op("sum", [g], axes=(axis,), keepdims=Scalar.lit(True))
    before = t.op("-", [t.op("cumsum", [g], axis=axis), g])
    return [t.op("-", [total, before])]


register(
    Op(
        "cumsum",
        (X,),
        lambda a, ctx: b.call("torch.cumsum", a[0], dim=_dim(ctx)),
        keys=LAST,
        result="sum",
        grad=_cumsum_grad,
        rank=SAME,
        mixes=along("axis"),
        bf16_risk="sums in bf16, which loses the small terms of a long sum",
        doc=(
            "the running sums along :axis, `torch.cumsum`; each sum rounds to the "
            "compute dtype. Of an integer or boolean tensor, int64 sums, never rounded "
            "(torch's)"
        ),
    )
)
