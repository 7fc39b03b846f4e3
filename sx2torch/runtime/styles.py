"""torch's tensor-parallel styles for a generated module's linear layers.

torch's ColwiseParallel and RowwiseParallel refuse anything but nn.Linear and nn.Embedding,
though they only split the `weight` (and `bias`) a layer holds in nn.Linear's [out, in]
layout, which a generated linear layer (`(linear x weight)`) holds too; these accept it.

A rowwise layer's partial products are where precision is decided (docs/LANGUAGE.md,
"Tensor parallelism"). DTensor computes each device's product in the layer's dtype and
all-reduces those: under bf16, each partial product rounded to bf16 and summed in bf16, as
transformers and torchtitan do (TP_REDUCE "bf16"). With TP_REDUCE "f32", the default, each
device's bf16 GEMM keeps its f32 accumulator (`matmul_f32_out`), the partial sums are
all-reduced in f32 and the sum rounded once: one device's rounding, up to the order of the
sum.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
)
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.nn import functional as F

from sx2torch.runtime.matmul import matmul_f32_out


class Colwise(ColwiseParallel):
    """ColwiseParallel on a generated linear layer: weight (and bias) split by rows."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        _check_linear(module)
        return _distribute(self, module, device_mesh)


class Rowwise(RowwiseParallel):
    """RowwiseParallel on a generated linear layer: weight split by columns, the input
    split along its features; `reduce` is the precision of the partial sums' all-reduce.
    """

    def __init__(self, reduce: str = "f32", **kwargs):
        super().__init__(**kwargs)
        if reduce not in ("f32", "bf16"):
            raise ValueError(f"reduce: expected 'f32' or 'bf16', got {reduce!r}")
        self.reduce = reduce
        self.desired_input_layouts = (Shard(-1),)

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        _check_linear(module)
        module = _distribute(self, module, device_mesh)
        if self.reduce == "f32":
            module.forward = _f32_partials(module.forward)
        return module


def _check_linear(module: nn.Module) -> None:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 2:
        raise TypeError(
            f"{type(module).__name__} is no linear layer: tensor parallelism splits a "
            "module holding a 2-D `weight` [out, in] (nn.Linear's layout)"
        )


def _distribute(style, module: nn.Module, device_mesh) -> nn.Module:
    """What torch's style does to an nn.Linear."""
    return distribute_module(
        module,
        device_mesh,
        style._partition_linear_fn,
        functools.partial(
            style._prepare_input_fn, style.input_layouts, style.desired_input_layouts
        ),
        functools.partial(
            style._prepare_output_fn, style.output_layouts, style.use_local_output
        ),
    )


def _f32_partials(forward):
    """The layer's forward with its bf16 `F.linear` of split operands computed as an f32
    partial sum, all-reduced in f32 and rounded once to bf16 when the forward returns.
    """

    @functools.wraps(forward)
    def reduced(*args, **kwargs):
        mode = _F32Partials()
        with mode:
            out = forward(*args, **kwargs)
        if mode.dtype is None:
            return out
        return out.redistribute(placements=[Replicate()]).to(mode.dtype)

    return reduced


class _F32Partials(torch.overrides.TorchFunctionMode):
    """`F.linear(x, w)` of bf16 DTensors, x split along its features and w by columns: each
    device's bf16 GEMM with its f32 accumulator, as a partial sum."""

    def __init__(self):
        super().__init__()
        self.dtype = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and _split_bf16(*args[:2]):
            x, w, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            self.dtype = x.dtype
            local = matmul_f32_out(x.to_local(), w.to_local().t())
            out = DTensor.from_local(local, x.device_mesh, [Partial()], run_check=False)
            if bias is None:
                return out
            return out.redistribute(placements=[Replicate()]) + bias.float()
        return func(*args, **kwargs)


def _split_bf16(x, w) -> bool:
    return (
        isinstance(x, DTensor)
        and isinstance(w, DTensor)
        and x.dtype == w.dtype == torch.bfloat16
        and x.placements[0].is_shard()
        and w.placements[0].is_shard(1)
    )
