"""The dtype of a value as a value: a number rounded to a tensor's dtype, and a cast to the
dtype the run computes in. Both are decided when the file compiles, as every dtype is.
"""

import sx2torch.build as b
from sx2torch.ops.registry import Arg, Op, register
from sx2torch.ops.rank import SAME, SCALAR


def _scalar_like(a, ctx):
    return b.call(
        "torch.tensor",
        ctx.attrs["value"],
        dtype=b.dotted(ctx.tensor_dtype),
        device=b.attr(a[0], "device"),
    )


register(
    Op(
        "scalar-like",
        (Arg("x"), Arg("value", "number")),
        _scalar_like,
        grad=lambda t, n, g: [None],
        doc=(
            "VALUE as a 0-d tensor in the dtype X computes in (bf16 where X is bf16), on "
            "X's device: Gemma's embedding scale, torch.tensor(hidden**0.5, dtype=x.dtype), "
            "rounded once from the number. Being 0-d it decides no dtype beside a tensor "
            "with axes; X is read only for its dtype and device, and gets no gradient"
        ),
        rank=SCALAR,
    )
)
register(
    Op(
        "cast-run",
        (Arg("x", "matrix"),),
        lambda a, ctx: a[0],
        result="run",
        converts=True,
        exact=True,
        grad=lambda t, n, g: [g],
        doc=(
            "X cast to the dtype the run computes in: bf16 under :bf16 (one rounding, as "
            "the real code's .type_as(x) on a bf16 x), the identity under :f32, f32 in an "
            "f32 island or beside a :numerics :high parameter, bf16 in a bf16 region"
        ),
        rank=SAME,
    )
)
