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
from sx2torch.ops.sequence import SEQUENCE
from sx2torch.ops.registry import Arg, Key, Op, register
from sx2torch.ops.rank import ATTENTION, BROADCAST, RankRule
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
        doc=(
            "the value the last attention of a :generate run feeds, at its last position "
            "while generating (transformers' logits_to_keep=1), else the value itself"
        ),
        rank=RankRule("X's with the sequence axis of size 1", _last),
        internal=True,
    )
)
