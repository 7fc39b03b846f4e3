"""The runtime that generated modules import as ``from sx2torch import runtime as sx``."""

from sx2torch.runtime.matmul import matmul_f32_out
from sx2torch.runtime.regions import bf16_region
from sx2torch.runtime.rounding import round_to_bf16

__all__ = ["bf16_region", "matmul_f32_out", "round_to_bf16"]
