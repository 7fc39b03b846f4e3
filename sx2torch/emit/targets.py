"""How each target holds bf16 values (section 7).

cuda: native bf16 tensors; a cast is `.to(torch.bfloat16)` or `.float()`.
metal and cpu: a bf16 value is an f32 tensor holding a bf16 value; a cast down is the
runtime's exact rounding (`sx.round_to_bf16`), a cast up changes no value (`sx.as_f32` rounds
only the gradient through it, as cuda's `.float()` does), and a node that computes in bf16
computes in f32 and rounds on store (`sx.store_bf16`, which also rounds the gradients the op
sends back), unless its op cannot leave the bf16 values (a reshape, a relu) or it stores the
f32 accumulator (`:out :f32`). A frozen parameter stored in bf16 is a real bf16
tensor (half the memory) read through an exact `.float()`.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from sx2torch.emit import build as b

DEVICE = {"cuda": "cuda", "metal": "mps", "cpu": "cpu"}


@dataclass(frozen=True)
class Target:
    name: str

    @property
    def device(self) -> str:
        """The device type of the `torch.autocast(..., enabled=False)` around f32 islands."""
        return DEVICE[self.name]

    @property
    def held(self) -> bool:
        return self.name != "cuda"

    def cast(self, value: b.Expr, have: str, want: str) -> b.Expr:
        """`value`, a tensor of dtype `have` ("bf16" for a real bf16 tensor), as `want`."""
        if _is_fill(value):  # zeros and ones are exact in either dtype: made in `want`
            held = "f32" if self.held else want
            dtype = b.dotted("torch.float32" if held == "f32" else "torch.bfloat16")
            return value.with_changes(
                args=[*value.args[:-1], value.args[-1].with_changes(value=dtype)]
            )
        if not self.held:
            return (
                b.method(value, "float")
                if want == "f32"
                else b.method(value, "to", b.dotted("torch.bfloat16"))
            )
        if have == "bf16-stored":
            return b.method(value, "float")
        if want == "bf16":
            return b.call("sx.round_to_bf16", value)
        # The gradient through this read is rounded before it is summed with those of
        # the value's other reads; a rounding written in place rounds it already.
        return value if _rounds(value) else b.call("sx.as_f32", value)

    def store(self, value: b.Expr, rounds: bool) -> b.Expr:
        """A bf16 node's result: held targets round what they computed in f32."""
        return b.call("sx.store_bf16", value) if self.held and rounds else value


def _rounds(value: b.Expr) -> bool:
    """Whether `value` is written as a held target's rounding, whose backward rounds."""
    return isinstance(value, cst.Call) and cst.Module([]).code_for_node(value.func) in (
        "sx.round_to_bf16",
        "sx.store_bf16",
    )


def _is_fill(value: b.Expr) -> bool:
    """Whether `value` is written as `torch.zeros_like(x, dtype=...)` or `ones_like`."""
    return (
        isinstance(value, cst.Call)
        and cst.Module([]).code_for_node(value.func)
        in ("torch.zeros_like", "torch.ones_like")
        and len(value.args) == 2
        and value.args[-1].keyword is not None
        and value.args[-1].keyword.value == "dtype"
    )
