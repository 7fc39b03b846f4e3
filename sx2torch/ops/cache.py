"""The cache's ops: what the `cache` pass (sx2torch/cache.py) makes of a `:generate true`
run's causal attention, causal convolution and scan along the sequence, positions and last
tokenwise value. Each is written as a call of sx2torch/runtime/cache.py, which computes the
plain op where no generation runs, so the module trains as before; while one runs, the
attention keeps its keys and values, the convolution its last inputs and the scan its last
value (each in the dtype the op reads it in, a literal here: the store is a copy, never a
rounding), positions start where the cache ends, and the value after the last of them keeps
its last position.
"""

import sx2torch.build as b
import sx2torch.ops.conv as conv
import sx2torch.ops.sharding as sharding
import sx2torch.ops.sequence as sequence
from sx2torch.ops.sequence import LENGTH, OPEN_KEYS, SEQUENCE
from sx2torch.ops.registry import Arg, Key, Op, register
from sx2torch.ops.rank import (
    ATTENTION,
    BROADCAST,
    MATMUL,
    SAME,
    RankRule,
    Tail,
    known,
)
from sx2torch.ops.construct import ARANGE_OF, LIKE
from sx2torch.ops.sequence import convolved
from sx2torch.ops.fused import held_rounding


def _cached_attention(a, ctx):
    extra = {"dtype": b.dotted(ctx.tensor_dtype)}
    for key, word in (("scale", "scale"), ("window", "window"), ("softcap", "softcap")):
        if ctx.attrs[key] is not None:
            extra[word] = ctx.attrs[key]
    if ctx.values["enable-gqa"] is not False:
        extra["enable_gqa"] = ctx.attrs["enable-gqa"]
    if ctx.attrs["softcap"] is not None:
        extra.update(held_rounding(ctx))
    return b.call("sx.cached_attention", *a, **extra)


register(
    Op(
        "cached-attention",
        (Arg("q", "matrix"), Arg("k", "matrix"), Arg("v", "matrix")),
        _cached_attention,
        keys=(
            Key("scale", "number"),
            Key("window", "int"),
            Key("enable-gqa", "bool", False),
            Key("softcap", "number"),
        ),
        doc=(
            "`(attention q k v :causal true ...)` in a :generate run, keeping K and V in "
            "the cache (sx.cached_attention), in the dtype it computes in, a literal; "
            "with :softcap, transformers' eager attention over the cache's keys"
        ),
        autocasts=True,
        rank=ATTENTION,
        # per head, as `attention`: each device keeps its own heads' keys and values
        shards=sharding.attention,
        caches=True,
        internal=True,
    )
)


def _kept_keys(shapes, attrs):
    """torch.matmul's, where B's axis :keys holds the positions the cache keeps (in the
    cache pass's shapes, sx2torch/ops/sequence.py): Kᵀ's columns are every key stored and
    the chunk's, not yet masked; V's rows are the keys of the scores that read them."""
    a, kept = shapes
    keys = known(attrs["keys"])
    if a and kept and not isinstance(kept, Tail) and kept[keys] == LENGTH:
        key = OPEN_KEYS if keys == -1 else (a[-1] if not isinstance(a, Tail) else None)
        kept = kept[:keys] + (key,) + (kept[keys + 1 :] if keys == -2 else ())
    return MATMUL.shape((a, kept), attrs)


register(
    Op(
        "cached-matmul",
        (Arg("a", "matrix"), Arg("b", "matrix")),
        lambda a, ctx: b.call(
            "sx.cached_matmul",
            *a,
            keys=ctx.attrs["keys"],
            dtype=b.dotted(ctx.tensor_dtype),
        ),
        keys=(Key("keys", "int"),),
        doc=(
            "`matmul` of attention written out in a :generate run (sx.cached_matmul): B's "
            "positions (:keys, -1 of Kᵀ, -2 of V) kept in the cache as [..., positions, "
            "dim], in the dtype it computes in, a literal, and read before the chunk's"
        ),
        autocasts=True,
        rank=RankRule("torch.matmul's", _kept_keys, tails=True),
        caches=True,
        internal=True,
    )
)
register(
    Op(
        "cached-causal-mask",
        (Arg("x"),),
        lambda a, ctx: b.call(
            "sx.cached_causal_mask",
            a[0],
            **({} if ctx.attrs["fill"] is None else {"fill": ctx.attrs["fill"]}),
        ),
        keys=(Key("fill", "number"),),
        exact=True,
        rank=SAME,
        sequence=sequence.masked,
        doc=(
            "`causal-mask` of the scores of attention written out in a :generate run "
            "(sx.cached_causal_mask): aligned bottom-right, the chunk's query i sees the "
            "keys up to its own position"
        ),
        internal=True,
    )
)


register(
    Op(
        "cached-conv1d",
        (Arg("x", "matrix"), Arg("w", "matrix"), Arg("bias", "matrix")),
        lambda a, ctx: b.call(
            "sx.cached_conv1d",
            *a,
            **conv.conv_keys(ctx),
            dtype=b.dotted(ctx.tensor_dtype),
        ),
        keys=conv.CONV_KEYS,
        arity=(2, 3),
        doc=(
            "`conv1d` along the sequence in a :generate run (sx.cached_conv1d): its last "
            "(K - 1) x dilation inputs kept in the cache, in the dtype it computes in, a "
            "literal, and read before the chunk's; causal (:padding (K - 1) x dilation, "
            "stride 1), which it checks when it runs"
        ),
        autocasts=True,
        rank=conv.RANKS[1],
        sequence=convolved,
        state=True,
        internal=True,
    )
)
register(
    Op(
        "cached-linear-scan",
        (Arg("a"), Arg("b")),
        lambda a, ctx: b.call(
            "sx.cached_linear_scan",
            a[0],
            a[1],
            dim=ctx.attrs["axis"],
            dtype=b.dotted(ctx.tensor_dtype),
        ),
        keys=(Key("axis", "int", 1),),
        sensitive=True,
        doc=(
            "`linear-scan` along the sequence in a :generate run (sx.cached_linear_scan): "
            "its last value kept in the cache, in the dtype it computes in (f32: the "
            "library's mark), a literal, and carried into the chunk's first step"
        ),
        rank=BROADCAST,
        state=True,
        internal=True,
    )
)


def _positions(dtype: bool):
    def emit(a, ctx):
        extra = {"dtype": b.dotted(ctx.tensor_dtype)} if dtype else {}
        return b.call("sx.cache_positions", a[0], ctx.attrs["axis"], **extra)

    return emit


AXIS = (Key("axis", "int", SEQUENCE),)
for _name, _plain, _result in (
    ("cached-arange-of", "arange-of", "float"),
    ("cached-positions", "positions", "int"),
):
    register(
        Op(
            _name,
            (LIKE,),
            _positions(dtype=_result == "float"),
            keys=AXIS,
            result=_result,
            doc=f"`{_plain}` over the sequence axis in a :generate run: from the cache's length",
            rank=ARANGE_OF,
            internal=True,
        )
    )


def _last(shapes, attrs):
    (x,) = shapes
    if not x:
        return x
    axis = attrs["axis"].value
    return x[:axis] + (1,) + x[axis + 1 :]


# the cache pass puts it after forward's last cached op (sx2torch/cache.py)
LAST_POSITION = register(
    Op(
        "last-position",
        (Arg("x"),),
        lambda a, ctx: b.call("sx.last_position", a[0], ctx.attrs["axis"]),
        keys=AXIS,
        result="keep",
        exact=True,  # a slice (or the value itself): a held target rounds nothing
        doc=(
            "the value the last attention of a :generate run feeds, at its last position "
            "while generating (transformers' logits_to_keep=1), else the value itself"
        ),
        rank=RankRule("X's with the sequence axis of size 1", _last),
        internal=True,
    )
)
