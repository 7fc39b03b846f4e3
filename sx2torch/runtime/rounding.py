"""Exact float32 -> bfloat16 rounding, held in float32 (LANGUAGE.md 6.6, 7).

The metal and cpu targets hold bf16 values in f32 tensors and round only at
casts. The rounding is integer arithmetic on the f32 bit pattern rather than
``x.to(torch.bfloat16)``, so it gives the same bits on every device (bf16
support on MPS is patchy) and equals torch's own cast, round-to-nearest-even,
on every one of the 2^32 patterns (NaN payloads aside).

In eager mode the roundings are autograd Functions (and hooks on backward nodes);
code that torch.compile traces calls them as an op, ``torch.ops.sx2torch.round_to_bf16``,
which inductor computes as a cast it keeps on the CPU and in the integer form elsewhere
(``compiling.py``).

Each eager rounding's result is recorded as a held bf16 value: a method that rounds
(``saves_bf16``) has autograd save such values as bf16 tensors, half the memory, and a
rounding passes as it is a value or gradient that is one already.
"""

import functools
import threading
import weakref
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

__all__ = [
    "as_f32",
    "round_bits",
    "round_to_bf16",
    "saves_bf16",
    "store_bf16",
    "to_bf16",
]

_QUIET_NAN = 0x7FC00000
_HIGH_HALF = -0x10000  # 0xFFFF0000 as an int32
_HALF_ULP_BELOW = 0x7FFF  # half a bf16 ulp, less one: ties go to the even side


def round_bits(x: Tensor) -> Tensor:
    """Round ``x`` to bf16 in its bits: add half an ulp (ties to even), truncate.

    The int32 addition never overflows: a negative value's bits are a negative
    int32, and a positive one's reach the sign bit only from a NaN. A NaN is
    replaced by a quiet NaN first, because adding the bias to a NaN with a small
    payload (0x7F800001) would carry into inf, and one with a large payload past
    the sign bit. A finite value past the largest bf16 carries into the exponent
    and becomes inf, as the cast does; subnormals need no special case. Nine
    operations, since inductor writes code for each of them in every kernel that
    rounds (off the CPU: there it inlines the cast, ``compiling.py``).
    """
    bits = torch.where(torch.isnan(x), _QUIET_NAN, x.view(torch.int32))
    lsb = (bits >> 16) & 1
    return ((bits + _HALF_ULP_BELOW + lsb) & _HIGH_HALF).view(torch.float32)


def _round(x: Tensor) -> Tensor:
    """The rounding on eager kernels (compiled code has it inlined, ``compiling.py``); of a
    bf16 tensor on the CPU, its widening (its values are bf16 values)."""
    if x.device.type == "cpu":
        # The same bits (checked on all 2^32 patterns) in one pass instead of about ten.
        return x.to(torch.bfloat16).float()
    return round_bits(x)


@torch.library.custom_op("sx2torch::round_to_bf16", mutates_args=())
def rounding_op(x: Tensor) -> Tensor:
    """The rounding as compiled code calls it, forward and backward.

    Dynamo and AOTAutograd take an op whole, where they trace an autograd Function
    as two subgraphs (its forward and its backward) and AOTAutograd's cache takes it
    only behind a flag. Inductor computes the op fused with its neighbours
    (compiling.py): on the CPU as a cast that it keeps, where a plain
    ``.to(torch.bfloat16).float()`` round trip in a fused kernel keeps the f32 value
    unless the user has set ``emulate_precision_casts``; elsewhere as ``round_bits``.
    """
    return _round(x)


@rounding_op.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


rounding_op.register_autograd(lambda ctx, grad: rounding_op(grad))


class _RoundToBf16(torch.autograd.Function):
    """Rounding as a store into a bf16 value, both ways.

    The value is rounded, and so is the gradient flowing back into it: on the
    cuda target that gradient is a bf16 tensor, the result of a bf16 backward
    op. The backward is itself this rounding, so a double backward rounds too.
    A value's rounding is recorded as a held bf16 value (`_held`), a gradient's
    (`saved` None) is not. Where autograd may save the value (`saved`: grad mode was on),
    the CPU cast's own bf16 tensor is kept with it, which `saves_bf16` saves: no pass of
    its own, and the saved bits are the value's by construction.
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: Tensor, saved: Optional[bool]
    ) -> Tensor:
        if saved is None:
            return _round(x)
        if saved and x.device.type == "cpu":
            low = x.to(torch.bfloat16)
            return _held(_round(low), low)
        return _held(_round(x))

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple:
        return _gradient_rounded(grad), None


def _gradient_rounded(grad: Tensor) -> Tensor:
    """The gradient flowing back into a bf16 value, rounded (and recorded as held: a sum
    whose backward passes it on, such as a residual's, does not round it again): as it is
    where it is a held bf16 value already (rounded by the store's hook of the value's one
    read); as an autograd Function in a double backward, which rounds both ways."""
    if _is_held(grad):
        return grad
    if torch.is_grad_enabled():
        return _RoundToBf16.apply(grad, None)
    return _held(_round(grad))


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
    if torch.compiler.is_compiling():
        return rounding_op(x)
    return _RoundToBf16.apply(x, torch.is_grad_enabled())


class _Held(weakref.ref):
    """A held bf16 value's entry: a weak reference to it, its version counter then and the
    bf16 tensor that holds its values (None until one is needed)."""

    __slots__ = ("key", "version", "low")


# Each eager rounding's result, by id -> its entry: a held bf16 value, which `to_bf16`
# passes as it is and `saves_bf16` saves in 2 bytes while neither it nor a view of it is
# written in place. An entry goes with its tensor (the reference's callback). A plain dict
# by id, not torch's WeakTensorKeyDictionary: a lookup is a few times cheaper, and the step
# looks up a few hundred.
_ROUNDED: dict = {}


def _forget(entry: _Held) -> None:
    if _ROUNDED.get(entry.key) is entry:
        del _ROUNDED[entry.key]


def _held(x: Tensor, low: Optional[Tensor] = None) -> Tensor:
    if not x.is_inference():  # an inference tensor has no version counter
        entry = _Held(x, _forget)
        entry.key, entry.version, entry.low = id(x), x._version, low
        _ROUNDED[entry.key] = entry
    return x


def _entry(base: Tensor) -> Optional[_Held]:
    entry = _ROUNDED.get(id(base))
    return entry if entry is not None and entry() is base else None


def _is_held(x: Tensor) -> bool:
    """Whether `x` is a held bf16 value: a rounding's result or a view of one, neither
    written in place since (a gradient summed in place into one is not)."""
    if x.dtype != torch.float32 or x.is_inference():
        return False
    entry = _entry(x if x._base is None else x._base)
    return entry is not None and entry.version == x._version


def to_bf16(x: Tensor) -> Tensor:
    """An argument cast down at a method's entry, as cuda's ``x.to(torch.bfloat16)``.

    A method that serves callers inside the module, which pass it bf16 values, and
    callers from outside, which may pass f32 ones, casts its argument at entry. On
    cuda the cast leaves a bf16 tensor as it is, with no backward of its own. Here a
    held bf16 value, the result of a rounding or a view of one (neither written in place
    since), passes as it is too, where rounding it again would cost a pass over it
    forward and one over its gradient backward, and change no bit: the value is a bf16
    value already, and every read of it inside rounds the gradient it sends back (a
    store's hook, ``as_f32``), as cuda's bf16 ops return bf16 gradients. Any other
    value is rounded, as ``round_to_bf16``. Compiled code always rounds: inductor fuses
    the rounding into its neighbours.
    """
    if not torch.compiler.is_compiling() and _is_held(x):
        return x
    return round_to_bf16(x)


def store_bf16(x: Tensor) -> Tensor:
    """The result of a bf16 op, computed in f32: rounded, and so is every gradient the
    op sends back to its inputs.

    On the cuda target the op runs on bf16 tensors, so its backward returns bf16
    gradients: each input's gradient is rounded before autograd sums it with the
    gradients of the input's other reads. A rounding of the sum alone (the backward
    of the input's own store) would round once where cuda rounds each term. The
    op's backward node is therefore hooked to return what cuda's would. Dynamo
    cannot trace a hook on a node, so compiled code rounds only at the stores
    themselves, as the forward does.
    """
    node = None if torch.compiler.is_compiling() else x.grad_fn
    if node is not None:
        # A batched matmul is a view of one mm: the hook goes on the mm.
        while type(node).__name__ in _VIEWS and len(node.next_functions) == 1:
            node = node.next_functions[0][0]
        node.register_hook(_bf16_backward(node, x))
    return round_to_bf16(x)


def _bf16_backward(node: torch.autograd.graph.Node, x: Tensor):
    """The hook that turns the f32 backward of ``node`` (its result ``x``) into a bf16
    op's: each gradient rounded; where the backward reads the op's own result (tanh,
    sigmoid, exp), that result as cuda stores it, rounded; where a product broadcast
    an operand, each term rounded before the sum to its shape, as a bf16 product
    rounds each one. Only plain references to saved values are held (no cycle
    through the node); a backward that builds a graph of its own (a double backward)
    keeps the f32 formula and only rounds.
    """
    name = type(node).__name__
    result = x.detach() if name in _FROM_RESULT else None
    operands = None
    if name == "MulBackward0":
        a, b = _peek(node)
        if a is not None and b is not None and a.shape != b.shape:
            operands = (a.detach(), b.detach())

    def hook(grad_inputs: tuple, grad_outputs: tuple) -> tuple:
        (grad,) = grad_outputs
        if torch.is_grad_enabled() or grad is None:
            return tuple(_rounded(g) for g in grad_inputs)
        # held bf16 values, which the roundings of the inputs' stores pass as they are
        return tuple(_held(g) if _is_f32(g) else g for g in rounded(grad_inputs, grad))

    def rounded(grad_inputs: tuple, grad: Tensor) -> tuple:
        if result is not None:
            return (_round(_FROM_RESULT[name](grad, _round(result))),)
        if operands is not None:
            a, b = operands
            return tuple(
                _round_terms(g, grad, other) for g, other in zip(grad_inputs, (b, a))
            )
        if name in _GEMMS:
            # A bf16 GEMM's accumulator starts at +0, so it never returns -0.0; an
            # f32 GEMM of one term can (-0.0 + 0.0 is +0.0, every other value stays;
            # added after the rounding, which keeps a zero's sign, in place).
            return tuple(
                None if g is None else _round(g).add_(0.0) for g in grad_inputs
            )
        # no graph is recorded here: the rounding itself, not its autograd Function;
        # a gradient the op passes on as it came (a sum's) is held already
        return tuple(
            _round(g) if _is_f32(g) and not _is_held(g) else g for g in grad_inputs
        )

    return hook


def _peek(node: torch.autograd.graph.Node) -> tuple:
    """A product's operands as its node saved them (None where not needed): a held bf16
    value as its bf16 tensor, which `_round_terms` multiplies exactly in f32, so that the
    hook holds no f32 copy of what autograd saves in 2 bytes."""
    _PEEKING.on = True
    try:
        return getattr(node, "_saved_self", None), getattr(node, "_saved_other", None)
    finally:
        _PEEKING.on = False


def _round_terms(g: Tensor | None, grad: Tensor, other: Tensor) -> Tensor | None:
    """The gradient of a product's operand whose other operand is `other`, as a bf16
    product gives it: each term rounded, then summed to the operand's shape and rounded.
    Where the operand has the product's shape there is no sum, and `g` is the terms."""
    if g is None:
        return None
    if g.shape == grad.shape:
        return _round(g)
    return _round(_round(grad * other).sum_to_size(g.shape))


_VIEWS = {"ViewBackward0", "UnsafeViewBackward0"}
_GEMMS = {"MmBackward0", "BmmBackward0"}


_FROM_RESULT = {
    "TanhBackward0": torch.ops.aten.tanh_backward,
    "SigmoidBackward0": torch.ops.aten.sigmoid_backward,
    "ExpBackward0": torch.mul,
}


def _is_f32(grad: Tensor | None) -> bool:
    return grad is not None and grad.dtype == torch.float32


def _rounded(grad: Tensor | None) -> Tensor | None:
    return _RoundToBf16.apply(grad, None) if _is_f32(grad) else grad


class _AsF32(torch.autograd.Function):
    """A bf16 value read as f32: nothing forward, the gradient rounded backward."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> Tensor:
        return _gradient_rounded(grad)


def as_f32(x: Tensor) -> Tensor:
    """A held bf16 value read in f32, as cuda's ``.float()`` reads a bf16 tensor.

    The value is unchanged; the gradient flowing back through the read is rounded
    to bf16, as the backward of cuda's cast rounds it, before autograd sums it
    with the gradients of the value's bf16 reads.
    """
    if torch.compiler.is_compiling():
        return reading_op(x)
    return _AsF32.apply(x)


@torch.library.custom_op("sx2torch::as_f32", mutates_args=())
def reading_op(x: Tensor) -> Tensor:
    """``as_f32`` as compiled code calls it (see ``rounding_op``): a copy, which
    inductor elides, and a rounding backward."""
    return x.clone()


@reading_op.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


reading_op.register_autograd(lambda ctx, grad: rounding_op(grad))


class _Bf16(NamedTuple):
    """A held bf16 value as autograd saves it: the bf16 tensor of its values."""

    low: Tensor


# Set while a store's hook takes the operands its op saved as they are saved (`_peek`).
_PEEKING = threading.local()


def _pack(x: Tensor):
    """What autograd saves of `x`: a held bf16 value (the result of a rounding, or a view
    of one, neither written in place since) as its bf16 tensor, 2 bytes a value; any other
    tensor as it is (an f32 island's values, which are not bf16 values). A value saved by
    several ops (a rounded weight and its readers) is one bf16 tensor."""
    if type(x) is not Tensor or not _is_held(x):  # a DTensor's shards as they are
        return x
    base = x if x._base is None else x._base
    entry = _entry(base)
    low = entry.low
    # rounded off the CPU or without grad: made once, however often saved
    if low is None:
        low = _high_halves(base)
        entry.low = low
    if low.stride() != base.stride():
        return x
    return _Bf16(low.as_strided(x.size(), x.stride(), x.storage_offset()))


def _high_halves(x: Tensor) -> Tensor:
    """The bf16 tensor of a held bf16 value's bits, their high halves (the low ones are
    zero), strided as `x`. Not torch's cast: on the CPU its vectorized and scalar loops
    write a NaN differently (0xFFFF and 0x7FC0 here), so a NaN that one loop rounded would
    not always come back with its bits."""
    return (x.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)


def _unpack(saved):
    """The tensor `_pack` saved, as it was: bf16 -> f32 is exact (NaN payloads, -0.0,
    infinities and subnormals kept bit for bit)."""
    if not isinstance(saved, _Bf16):
        return saved
    return saved.low if getattr(_PEEKING, "on", False) else saved.low.float()


def saves_bf16(method: Callable) -> Callable:
    """A held target's method: what autograd saves of its held bf16 values for the backward
    is their bf16 tensors (`_pack`), half the memory of f32 ones, restored exactly. Within
    a method that does so already, under hooks of the caller's own
    (`torch.utils.checkpoint`, `save_on_cpu`) and in compiled code, the method runs as it
    is."""

    @functools.wraps(method)
    def saving(*args, **kwargs):
        if (
            torch.compiler.is_compiling()
            or not torch._C._autograd._saved_tensors_hooks_is_enabled()
            or torch._C._autograd._top_saved_tensors_default_hooks(True) is not None
        ):
            return method(*args, **kwargs)
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            return method(*args, **kwargs)

    return saving
