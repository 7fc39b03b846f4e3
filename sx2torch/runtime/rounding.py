"""Exact float32 -> bfloat16 rounding, held in float32 (LANGUAGE.md 6.6, 7).

The metal and cpu targets hold bf16 values in f32 tensors and round only at
casts. The rounding is integer arithmetic on the f32 bit pattern rather than
``x.to(torch.bfloat16)``, so it gives the same bits on every device (bf16
support on MPS is patchy) and equals torch's own cast, round-to-nearest-even,
on every one of the 2^32 patterns (NaN payloads aside).
"""

import torch
from torch import Tensor

__all__ = ["round_bits", "round_to_bf16"]

_SIGN = -0x80000000  # 0x80000000 as an int32
_MAGNITUDE = 0x7FFFFFFF
_INF = 0x7F800000
_QUIET_NAN = 0x7FC00000
_HIGH_HALF = -0x10000  # 0xFFFF0000 as an int32
_HALF_ULP_BELOW = 0x7FFF  # half a bf16 ulp, less one: ties go to the even side


def round_bits(x: Tensor) -> Tensor:
    """Round ``x`` to bf16 in its bits: add half an ulp (ties to even), truncate.

    The sign is set aside and the magnitude rounded, so the int32 addition
    never overflows: a magnitude is at most 0x7FC00000 when the bias is added.
    A NaN is replaced by a quiet NaN first, because adding the bias to a NaN
    with a small payload (0x7F800001) would carry into inf, and one with a
    large payload past the sign bit. A finite value past the largest bf16
    carries into the exponent and becomes inf, as the cast does; subnormals
    need no special case.
    """
    bits = x.view(torch.int32)
    sign = bits & _SIGN
    magnitude = bits & _MAGNITUDE
    magnitude = torch.where(magnitude > _INF, _QUIET_NAN, magnitude)
    lsb = (magnitude >> 16) & 1
    rounded = (magnitude + _HALF_ULP_BELOW + lsb) & _HIGH_HALF
    return (rounded | sign).view(torch.float32)


def _round(x: Tensor) -> Tensor:
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        # The same bits (checked on all 2^32 patterns) in one fused pass instead of
        # about ten; compiled code keeps the integer form, which inductor cannot drop.
        return x.to(torch.bfloat16).float()
    return round_bits(x)


class _RoundToBf16(torch.autograd.Function):
    """Rounding as a store into a bf16 value, both ways.

    The value is rounded, and so is the gradient flowing back into it: on the
    cuda target that gradient is a bf16 tensor, the result of a bf16 backward
    op. The backward is itself this rounding, so a double backward rounds too.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor) -> Tensor:
        return _round(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> Tensor:
        return _RoundToBf16.apply(grad)


def round_to_bf16(x: Tensor) -> Tensor:
    """Return the bfloat16 value nearest to ``x`` (ties to even), as float32.

    Bitwise equal to ``x.to(torch.bfloat16).float()`` for every non-NaN input;
    a NaN stays a NaN (its payload is not kept), ±inf and ±0 are kept, and a
    finite value that rounds past the largest bf16 becomes ±inf. The gradient
    is rounded the same way: a gradient flowing into a bf16 value is a bf16
    value, as on the cuda target, where each backward op of a bf16 value
    rounds its result.

    A bfloat16 tensor (a frozen parameter stored in bf16, passed to a defun) is
    widened exactly instead: it holds bf16 values already.
    """
    if x.dtype == torch.bfloat16:
        return x.float()
    if x.dtype != torch.float32:
        raise TypeError(
            f"round_to_bf16 takes a float32 or bfloat16 tensor, got {x.dtype}"
        )
    return _RoundToBf16.apply(x)
