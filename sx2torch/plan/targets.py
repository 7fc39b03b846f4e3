"""How each target holds bf16 values (section 7), as the plan decides its casts' spellings.

cuda: native bf16 tensors; a cast is `.to(torch.bfloat16)` or `.float()`.
metal and cpu: a bf16 value is an f32 tensor holding a bf16 value; a cast down is the
runtime's exact rounding (`sx.round_to_bf16`), a cast up changes no value (`sx.as_f32` rounds
only the gradient through it, as cuda's `.float()` does), and a node that computes in bf16
computes in f32 and rounds on store (`sx.store_bf16`, which also rounds the gradients the op
sends back), unless its op cannot leave the bf16 values (a reshape, a relu) or it stores the
f32 accumulator (`:out :f32`). A frozen parameter stored in bf16 is a real bf16
tensor (half the memory) read through an exact `.float()`. sx2torch/emit/targets.py writes
each spelling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sx2torch.ir import DType

DEVICE = {"cuda": "cuda", "metal": "mps", "cpu": "cpu"}
# A value a caller may pass as booleans where the policy types it a float (attention's mask:
# True attends, where a float is added to the scores): `have` is "f32 or bool", and its
# cast, spelled MASK + the float's spelling, converts a float and leaves booleans as they are.
OR_BOOL = " or bool"
MASK = "mask-"
# An argument a caller may pass as None (a loop's value that starts as none), cast down at
# entry: spelled OPTIONAL + the tensor's spelling, None left as it is.
OR_NONE = " or none"
OPTIONAL = "optional-"


def or_bool(have: str) -> str:
    return have + OR_BOOL


def or_none(have: str) -> str:
    return have + OR_NONE


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

    def spelling(self, have: str, want: str, written: Optional[str]) -> Optional[str]:
        """How a cast from `have` ("bf16-stored" for a real bf16 tensor) to `want` is written
        on a value written as `written` ("fill": `torch.ones_like(x, dtype=...)`;
        "rounding": a held target's rounding; else None): "fill" (made in `want` instead),
        "float", "to-bf16", "round", "as-f32", "float-round" (an integer rounded to bf16 on a held
        target), one of those after MASK (a float converted, booleans left as they are),
        or None where nothing is written."""
        if have.endswith(OR_NONE):  # None passes as it is
            spelled = self.spelling(have[: -len(OR_NONE)], want, written)
            return spelled and OPTIONAL + spelled
        if have.endswith(OR_BOOL):  # a mask's cast converts a float mask only
            spelled = self.spelling(have[: -len(OR_BOOL)], want, written)
            return spelled and MASK + spelled
        # an integer or a boolean made a float: a held target rounds an integer as any f32,
        # and leaves a boolean's 0 and 1, bf16 values already
        if have in (DType.INT, DType.BOOL):
            if want == "f32" or (have == DType.BOOL and self.held):
                return "float"
            return "float-round" if self.held else "to-bf16"
        if written == "fill":  # zeros and ones are exact in either dtype
            return (
                "fill" if not self.held else None
            )  # a held target's are f32 either way
        if not self.held:
            return "float" if want == "f32" else "to-bf16"
        if have == "bf16-stored":
            return "float"
        if want == "bf16":
            return "round"
        # The gradient through this read is rounded before it is summed with those of
        # the value's other reads; a rounding written in place rounds it already.
        return None if written == "rounding" else "as-f32"

    def entry(self, have: str, rounded: bool) -> str:
        """How an argument `have` ("f32", "f32 or bool" for a mask, either "or none") is cast down at a
        method's entry, where the method serves callers that pass bf16 values and callers
        from outside that may pass f32 ones: cuda's `.to(torch.bfloat16)` leaves a bf16
        tensor as it is, and a held target's "to-held" (`sx.to_bf16`) a held bf16 value,
        so neither rounds again what a caller inside has just rounded. Only where every
        read of the argument inside rounds the gradient it sends back (`rounded`): the
        rounding at entry then rounds no gradient either."""
        spelled = self.spelling(have, "bf16", None)
        if (
            rounded
            and spelled
            and spelled.removeprefix(OPTIONAL).removeprefix(MASK) == "round"
        ):
            return spelled[: -len("round")] + "to-held"
        return spelled
