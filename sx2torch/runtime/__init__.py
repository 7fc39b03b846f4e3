"""The runtime that generated modules import as ``from sx2torch import runtime as sx``."""

from sx2torch.runtime.attention import (
    causal_mask,
    eager_attention,
    mask_as,
    restrict_mask,
    window_mask,
)
from sx2torch.runtime.cache import (
    cache_positions,
    cached_attention,
    cached_causal_mask,
    cached_conv1d,
    cached_linear_scan,
    cached_matmul,
    last_position,
    once,
)
from sx2torch.runtime.checks import expect_scalar
from sx2torch.runtime.compiling import prepare_compiling
from sx2torch.runtime.experts import sparse_experts
from sx2torch.runtime.generate import generate
from sx2torch.runtime.located import install as _show_source_of_errors
from sx2torch.runtime.grad import (
    concat_part,
    cross_entropy_backward,
    group_norm_backward,
    rms_norm_backward,
    rms_norm_weight_backward,
    slice_backward,
    take_backward,
)
from sx2torch.runtime.matmul import matmul_f32_out
from sx2torch.runtime.optim import newton_schulz
from sx2torch.runtime.regions import bf16_region
from sx2torch.runtime.rounding import (
    as_f32,
    round_to_bf16,
    saves_bf16,
    store_bf16,
    to_bf16,
)
from sx2torch.runtime.sizes import layers
from sx2torch.runtime.scan import (
    linear_scan,
    linear_scan_adjoint,
    matrix_scan,
    matrix_scan_adjoint,
    previous,
)

__all__ = [
    "as_f32",
    "cache_positions",
    "cached_attention",
    "cached_causal_mask",
    "cached_conv1d",
    "cached_linear_scan",
    "cached_matmul",
    "bf16_region",
    "causal_mask",
    "concat_part",
    "cross_entropy_backward",
    "eager_attention",
    "expect_scalar",
    "generate",
    "group_norm_backward",
    "last_position",
    "layers",
    "mask_as",
    "linear_scan",
    "linear_scan_adjoint",
    "matmul_f32_out",
    "matrix_scan",
    "matrix_scan_adjoint",
    "newton_schulz",
    "once",
    "previous",
    "round_to_bf16",
    "saves_bf16",
    "slice_backward",
    "sparse_experts",
    "store_bf16",
    "take_backward",
    "to_bf16",
    "window_mask",
    "restrict_mask",
]

prepare_compiling()
_show_source_of_errors()
