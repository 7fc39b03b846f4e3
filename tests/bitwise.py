"""Bitwise comparison of tensors, shared by the numeric tests."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

BF16, F32 = torch.bfloat16, torch.float32


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns, so that equality is exact (and NaN equals the same NaN)."""
    view = {BF16: torch.int16, F32: torch.int32}.get(t.dtype)
    t = t.detach().contiguous()
    return t.view(view) if view is not None else t


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bitwise equality, dtype and shape included."""
    assert (
        actual.dtype == expected.dtype
    ), f"dtype {actual.dtype}, expected {expected.dtype}"
    assert (
        actual.shape == expected.shape
    ), f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    assert torch.equal(
        bits(actual), bits(expected)
    ), f"values differ:\n{actual}\nexpected\n{expected}"


# --- The host's order of summation ---------------------------------------------
#
# A bf16 GEMM on the CPU (oneDNN's AVX-512-BF16 kernel, its AVX2 one, ATen's scalar one
# under ATEN_CPU_CAPABILITY=default) multiplies the bf16 operands exactly, adds the products
# in an f32 accumulator and rounds the sum once to bf16, and so does a sum of bf16 values,
# but each kernel adds in its own order, and a GPU in another. The held targets write the
# same computation as the host's f32 kernel on the bf16 values, rounded once. Where partial
# sums are not exact in f32, "the native module's bits" would depend on the host's ISA: so
# `HeldSums` runs the native module with the held form's GEMMs and sums (and the one
# kernel that differs), after checking the host's own against them.

U_BF16 = 2.0**-8  # bf16's unit roundoff: 8 significand bits, round to nearest
U_F32 = 2.0**-24
_aten = torch.ops.aten
GEMMS = (_aten.mm.default, _aten.bmm.default)
SUMS = (_aten.sum.default, _aten.sum.dim_IntList, _aten.mean.default, _aten.mean.dim)
# The one elementwise op of the golden cases whose bf16 CPU kernel is not its f32 kernel
# rounded once (on AVX2 and under ATEN_CPU_CAPABILITY=default): gelu's derivative
# Phi(x) + x phi(x), whose f32 kernel loses what lies below 2^-24 in 1 + erf(x / sqrt 2)
# for x < -5, where the bf16 one keeps it.
GELU_BACKWARD = _aten.gelu_backward.default
FUSED_GEMMS = (_aten.addmm.default, _aten.baddbmm.default)


def _magnitudes(func, args: tuple, kwargs: dict) -> tuple[torch.Tensor, int]:
    """The op on the operands' magnitudes, in f64 (for a GEMM |a| @ |b|, for a sum the
    sum of |x| and a mean their mean), and how many terms each output element adds."""
    first, *rest = args
    if func in GEMMS:
        return func(first.double().abs(), rest[0].double().abs()), first.shape[-1]
    out = func(first.double().abs(), *rest, **kwargs)
    return out, first.numel() // max(out.numel(), 1)


def order_bound(func, args: tuple, kwargs: dict, x, y) -> torch.Tensor:
    """How far two bf16 results of `func(*args)` that differ only in their f32 order of
    summation may lie apart, elementwise. Each f32 sum of n exact terms (a GEMM's products
    of bf16 values are exact in f32) is within gamma(n - 1) * M of the exact one, where M
    is the op on the terms' magnitudes and gamma(n) = n u / (1 - n u), u = 2^-24; a mean's
    division rounds once more, so gamma(n) bounds both. The two f32 results then lie within
    2 gamma(n) M; rounding each to bf16 moves it by at most U_BF16 of its magnitude
    (|s| <= |rn(s)| / (1 - U_BF16)); 2^-133 covers bf16's subnormals."""
    magnitude, n = _magnitudes(func, args, kwargs)
    gamma = n * U_F32 / (1 - n * U_F32)
    rounding = U_BF16 / (1 - U_BF16) * (x.double().abs() + y.double().abs())
    return 2 * gamma * magnitude + rounding + 2.0**-133


def gelu_backward_bound(args: tuple, x, y) -> torch.Tensor:
    """Each kernel computes gelu'(x) = Phi(x) + x phi(x) (|Phi| <= 1, |x phi(x)| <= 0.25)
    to within an f32 ulp of 1, 2^-24, before its bf16 rounding (measured over every bf16
    x in [-20, 20]: 0.34 and 0.21 times 2^-24), times the incoming gradient: the two lie
    within 2 * 2^-24 |dy| and their roundings."""
    rounding = U_BF16 / (1 - U_BF16) * (x.double().abs() + y.double().abs())
    return 2 * U_F32 * args[0].double().abs() + rounding + 2.0**-133


def exact_in_any_order(func, args: tuple, kwargs: dict) -> bool:
    """Whether every term and partial sum is an integer below 2^24 in magnitude, so exact
    in f32 (a mean divides the exact sum once): then every order gives the same bits."""
    terms = [a for a in args if isinstance(a, torch.Tensor)]
    integers = all(torch.equal(t, t.round()) for t in terms)
    return integers and bool((_magnitudes(func, args, kwargs)[0] < 2.0**24).all())


class HeldSums(TorchDispatchMode):
    """Compute every bf16 GEMM (`mm`, `bmm`) and sum (`sum`, `mean`), and gelu's backward,
    as the held targets do, the f32 op on the bf16 values rounded once, after checking the
    host's bf16 op against it: bit for bit where the sum is exact in any order
    (`exact_in_any_order`), else within `order_bound` (`gelu_backward_bound`). `exact`,
    `ordered` and `kernels` count the three kinds.

    A fused bf16 GEMM (`addmm`, `baddbmm`: F.linear with a bias) has no held twin here and
    is refused."""

    def __init__(self):
        super().__init__()
        self.exact = self.ordered = self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        bf16 = any(isinstance(a, torch.Tensor) and a.dtype == BF16 for a in args)
        if bf16 and func in FUSED_GEMMS:
            raise NotImplementedError(f"HeldSums: no held form of bf16 {func}")
        native = func(*args, **kwargs)
        if func not in (*GEMMS, *SUMS, GELU_BACKWARD) or native.dtype != BF16:
            return native
        widened = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
        # A bf16 GEMM's accumulator starts at +0, so it never returns -0.0, which an f32
        # GEMM of one term can (-0.0 + 0.0 is +0.0).
        held = (func(*widened, **kwargs) + (0.0 if func in GEMMS else -0.0)).to(BF16)
        if func is GELU_BACKWARD:
            self.kernels += 1
            self.check(native, held, gelu_backward_bound(args, native, held), func)
        elif exact_in_any_order(func, args, kwargs):
            self.exact += 1
            assert torch.equal(bits(native), bits(held)), f"exact {func} differs"
        else:
            self.ordered += 1
            self.check(
                native, held, order_bound(func, args, kwargs, native, held), func
            )
        return held

    @staticmethod
    def check(native, held, bound, func) -> None:
        apart = (native.double() - held.double()).abs()
        assert bool((apart <= bound).all()), (
            f"{func}: the host's bf16 result lies {float((apart / bound).max()):.3g}"
            " times its bound from the held form's"
        )
