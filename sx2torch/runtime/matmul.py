"""The f32-out matmul, ``(matmul a b :out :f32)`` (LANGUAGE.md 6.4, 7).

bf16 operands, a bf16 GEMM, and the f32 accumulator stored instead of being
rounded to bf16. The gradient reaches the operands as bf16, so the backward
products are bf16 GEMMs too.

On the metal and cpu targets (``held=True``) the operands are bf16 values held
in f32 tensors; the forward is their f32 GEMM, and the backward emulates the
bf16 GEMMs: the incoming gradient is rounded to bf16 values, multiplied in f32
(exact products, an f32 accumulator) and each product rounded on store.

Only the 2-D and 3-D products (``torch.mm``/``torch.bmm``) are custom autograd
functions; ``torch.matmul``'s 1-D operands, batching and broadcasting are
ordinary reshapes and expands around them, so autograd itself sums the
gradient of a broadcast operand back to its shape.
"""

import contextlib
import math
from collections.abc import Callable

import torch
from torch import Tensor

from sx2torch.runtime.rounding import round_to_bf16, rounding_op

__all__ = ["matmul_f32_out"]


def _no_autocast(x: Tensor) -> contextlib.AbstractContextManager[None]:
    """An ambient autocast must not recast the operands or the f32 result.

    A device without autocast (``meta``) rejects ``torch.autocast`` itself.
    """
    if torch.amp.is_autocast_available(x.device.type):
        return torch.autocast(device_type=x.device.type, enabled=False)
    return contextlib.nullcontext()


def _gemm_f32_out(a: Tensor, b: Tensor) -> Tensor:
    """The f32 product of bf16 matrices (2-D) or batches of matrices (3-D).

    On CUDA, cuBLAS's bf16 GEMM with an f32 output (``aten::mm.dtype``,
    CUDA-only in PyTorch 2.13). Elsewhere the f32 GEMM of the bf16 values,
    which is exact in the products and accumulates in f32 as well.
    """
    if a.device.type == "cuda":
        gemm = torch.mm if a.dim() == 2 else torch.bmm
        return gemm(a, b, out_dtype=torch.float32)
    return torch.matmul(a.float(), b.float())


class _GemmF32Out(torch.autograd.Function):
    """``_gemm_f32_out`` with bf16 GEMMs for the operands' gradients."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, a: Tensor, b: Tensor, held: bool
    ) -> Tensor:
        ctx.save_for_backward(a, b)
        ctx.held = held
        return gemm_forward(a, b, held)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None]:
        return _backward(ctx, grad, round_to_bf16)


def gemm_forward(a: Tensor, b: Tensor, held: bool) -> Tensor:
    with _no_autocast(a):
        return torch.matmul(a, b) if held else _gemm_f32_out(a, b)


def _backward(
    ctx: torch.autograd.function.FunctionCtx,
    grad: Tensor,
    rounding: Callable[[Tensor], Tensor],
) -> tuple[Tensor | None, Tensor | None, None]:
    a, b = ctx.saved_tensors
    # Held: bf16 values in f32, the products emulating bf16 GEMMs.
    grad = rounding(grad) if ctx.held else grad.to(torch.bfloat16)
    grad_a = grad_b = None
    with _no_autocast(grad):
        if ctx.needs_input_grad[0]:
            grad_a = torch.matmul(grad, b.transpose(-2, -1))
        if ctx.needs_input_grad[1]:
            grad_b = torch.matmul(a.transpose(-2, -1), grad)
    if ctx.held:
        # Rounded on store, as a bf16 GEMM stores its result. Its accumulator starts at
        # +0, so it never returns -0.0, which an f32 GEMM of one term can (-0.0 + 0.0
        # is +0.0); a native bf16 GEMM rounds on store by itself.
        grad_a, grad_b = (
            None if g is None else rounding(g + 0.0) for g in (grad_a, grad_b)
        )
    return grad_a, grad_b, None


@torch.library.custom_op("sx2torch::gemm_f32_out", mutates_args=())
def gemm_op(a: Tensor, b: Tensor, held: bool) -> Tensor:
    """``_GemmF32Out`` as compiled code calls it: an op, as ``rounding_op`` is, for
    the same reasons; inductor replaces it by its GEMM (compiling.py)."""
    return gemm_forward(a, b, held)


@gemm_op.register_fake
def _(a: Tensor, b: Tensor, held: bool) -> Tensor:
    return a.new_empty((*a.shape[:-1], b.shape[-1]), dtype=torch.float32)


def _setup_gemm(
    ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor
) -> None:
    a, b, ctx.held = inputs
    ctx.save_for_backward(a, b)


gemm_op.register_autograd(
    lambda ctx, grad: _backward(ctx, grad, rounding_op), setup_context=_setup_gemm
)


def _gemm(a: Tensor, b: Tensor, held: bool) -> Tensor:
    if torch.compiler.is_compiling():
        return gemm_op(a, b, held)
    return _GemmF32Out.apply(a, b, held)


def matmul_f32_out(a: Tensor, b: Tensor, held: bool = False) -> Tensor:
    """``torch.matmul(a, b)`` of bf16 operands, returning the f32 accumulator.

    Shapes follow ``torch.matmul`` (1-D operands, batching, broadcasting). A
    float operand that is not bf16 is first cast down to bf16 (nearest-even),
    as the precision policy would; the gradient then flows back through that
    cast, so such an operand receives its gradient in its own dtype, while a
    bf16 operand receives a bf16 gradient.

    With ``held=True`` (the metal and cpu targets) the operands are float32
    tensors holding bf16 values, used as they are; their gradients are float32
    tensors holding the bf16 GEMMs' results.
    """
    if not (a.is_floating_point() and b.is_floating_point()):
        raise TypeError(
            f"matmul_f32_out takes float tensors, got {a.dtype} and {b.dtype}"
        )
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError("matmul_f32_out: both operands need at least one dimension")
    if held and not a.dtype == b.dtype == torch.float32:
        raise TypeError(
            f"matmul_f32_out(held=True) takes float32 tensors, got {a.dtype} and {b.dtype}"
        )
    if not held:
        a = a.to(torch.bfloat16)
        b = b.to(torch.bfloat16)
    a_vector, b_vector = a.dim() == 1, b.dim() == 1
    if a_vector:
        a = a.unsqueeze(0)
    if b_vector:
        b = b.unsqueeze(-1)
    out = _batched(a, b, held)
    if a_vector:
        out = out.squeeze(-2)
    if b_vector:
        out = out.squeeze(-1)
    return out


def _batched(a: Tensor, b: Tensor, held: bool) -> Tensor:
    """Reduce an at-least-2-D product to one ``mm`` or ``bmm``, as torch.matmul does.

    A batched ``a`` times a matrix ``b`` folds the batch into ``a``'s rows: one
    ``mm``, with no copy of ``b`` per batch, and ``b``'s gradient summed over the
    batch inside that GEMM's f32 accumulator. Otherwise the batch dimensions are
    broadcast, flattened into one, and multiplied by ``bmm``.
    """
    if b.dim() == 2:
        rows = a.reshape(math.prod(a.shape[:-1]), a.shape[-1])
        return _gemm(rows, b, held).reshape(*a.shape[:-1], b.shape[-1])
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    size = math.prod(batch)
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(size, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(size, *b.shape[-2:])
    return _gemm(a3, b3, held).reshape(*batch, a.shape[-2], b.shape[-1])
