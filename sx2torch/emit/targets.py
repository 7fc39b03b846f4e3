"""A cast as the plan spelled it (sx2torch/plan/targets.py says how each target holds bf16
values, and sx2torch/plan/spelled.py which spelling each cast gets), written as code."""

from __future__ import annotations

from typing import Optional

import libcst as cst

import sx2torch.build as b
from sx2torch.plan.spelled import Cast
from sx2torch.plan.targets import MASK, OPTIONAL

# what `sx.mask_as` converts a float mask with, for each spelling: a dtype, or a held
# target's function
MASK_CASTS = {
    "to-bf16": "torch.bfloat16",
    "float": "torch.float32",
    "round": "sx.round_to_bf16",
    "to-held": "sx.to_bf16",
    "as-f32": "sx.as_f32",
}


def cast(value: b.Expr, spelled: Optional[Cast]) -> b.Expr:
    """`value` cast as the plan spelled it; None: `value` as it is."""
    if spelled is None:  # most reads
        return value
    spelling = spelled.spelling
    if spelling and spelling.startswith(OPTIONAL):  # a value that may be None
        return _optional(value, Cast(spelling[len(OPTIONAL) :], spelled.want))
    # a float mask cast, booleans as they are
    if spelling and spelling.startswith(MASK):
        how = MASK_CASTS[spelling[len(MASK) :]]
        return b.call("sx.mask_as", value, b.dotted(how))
    if spelling == "fill":  # made in the dtype wanted: `torch.ones_like(x, dtype=...)`
        dtype = b.dotted("torch.float32" if spelled.want == "f32" else "torch.bfloat16")
        return value.with_changes(
            args=[*value.args[:-1], value.args[-1].with_changes(value=dtype)]
        )
    if spelling == "float":
        return b.method(value, "float")
    if spelling == "float-round":
        return b.call("sx.round_to_bf16", b.method(value, "float"))
    if spelling == "to-bf16":
        return b.method(value, "to", b.dotted("torch.bfloat16"))
    if spelling == "round":
        return b.call("sx.round_to_bf16", value)
    if spelling == "to-held":
        return b.call("sx.to_bf16", value)
    return b.call("sx.as_f32", value) if spelling == "as-f32" else value


def _optional(value: b.Expr, inner: Cast) -> b.Expr:
    """`value` cast by `inner` where it holds a tensor, None passed as it is: a choice's
    branches each (`self.bias.to(torch.bfloat16) if self.has_bias else None`), a name
    (an argument, a local) tested (`None if x is None else x.to(torch.bfloat16)`), and
    any other expression, which makes a tensor, cast."""
    if isinstance(value, cst.IfExp):
        return value.with_changes(
            body=_optional(value.body, inner), orelse=_optional(value.orelse, inner)
        )
    if not isinstance(value, cst.Name):
        return cast(value, inner)
    if value.value == "None":
        return value
    absent = cst.Comparison(value, [cst.ComparisonTarget(cst.Is(), b.name("None"))])
    return cst.IfExp(absent, b.name("None"), cast(value, inner))


def store(value: b.Expr) -> b.Expr:
    """A bf16 node's result that a held target rounds, having computed it in f32."""
    return b.call("sx.store_bf16", value)
