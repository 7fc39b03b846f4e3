"""What torch.compile needs to compile generated modules well, scoped to the runtime.

An f32 island is a ``torch.autocast(..., enabled=False)`` block, which dynamo traces
into ``_enter_autocast``/``_exit_autocast`` calls. PyTorch 2.13 leaves both off the
AOTAutograd cache's allowlist (they are private), so every graph with an island
bypassed that cache: each warm start re-traced the joint forward and backward and
re-ran the partitioner (pytorch/pytorch#191106, fixed upstream by adding the two to the
allowlist). They are safe to cache: each only builds an autocast context from its
arguments (device, dtype, enabled), which are constants in the graph and so part of
its cache key. Inductor's own hook for this, ``unsafe_marked_cacheable_functions``,
marks them, keyed by the torch version.

Compiled code calls the runtime's roundings and f32-out GEMM as custom ops
(``torch.ops.sx2torch.*``), not as autograd Functions, which dynamo would trace as
a forward and a backward subgraph each, and which AOTAutograd's cache takes only
behind a process-wide flag (``autograd_cache_allow_custom_autograd_functions``).
An op is one node, which that cache takes as it is; inductor is given its
decomposition (or lowering), so that it fuses the op's plain operations with their neighbours
instead of calling the op. The registrations name only the runtime's own ops:
nothing else compiles differently.

On the CPU the rounding is lowered as torch's own cast there and back, fused, with
``use_compute_types=False``, the flag inductor's own ``emulate_precision_casts`` sets on
the casts it keeps: a plain cast to bf16 whose value stays in the kernel is one inductor
may leave in f32 (in C++ it takes the cast back from the cache as the value it cast), and
this one it keeps whatever the user's settings. That cast gives round_bits' bits (on x86
ATen's vector cast is the same integer algorithm; the cast was checked on all 2^32
patterns, as eager's CPU rounding is), in two
operations where the integer form has nine, which inductor would copy into every kernel
that rounds: that code is what made a held target's cold compile slower than cuda's, whose
bf16 code stores with one cast. On other devices (bf16 support on MPS is patchy) inductor
inlines ``round_bits``.
"""

import importlib.abc
import importlib.util
import sys

import torch

from sx2torch.runtime.matmul import gemm_forward
from sx2torch.runtime.rounding import round_bits

_AUTOCAST = ("_enter_autocast", "_exit_autocast")
_DECOMPOSITIONS = "torch._inductor.decomposition"
_LOWERINGS = "torch._inductor.lowering"


def prepare_compiling() -> None:
    """Registers the ops with inductor now if it is loaded, else as soon as it is: importing
    it (dynamo with it) doubles the import time of a process that never compiles."""
    for name, register in (
        (_DECOMPOSITIONS, _register),
        (_LOWERINGS, _register_lowering),
    ):
        if "torch._inductor" in sys.modules:
            register()
        else:
            sys.meta_path.insert(0, _AfterImport(name, register))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``register`` once the module ``name`` is loaded, before any compile."""

    def __init__(self, name: str, register) -> None:
        self.name, self.register = name, register

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            self.register()

        spec.loader.exec_module = exec_module
        return spec


def _register() -> None:
    # `as`: bound from sys.modules while the decomposition module is still being loaded
    import torch._inductor.config as config
    import torch._inductor.decomposition as inductor

    marked = config.unsafe_marked_cacheable_functions
    for name in _AUTOCAST:
        marked.setdefault(f"torch.amp.autocast_mode.{name}", torch.__version__)
    inductor.decompositions[torch.ops.sx2torch.round_to_bf16.default] = _rounding
    inductor.decompositions[torch.ops.sx2torch.as_f32.default] = torch.clone
    inductor.decompositions[torch.ops.sx2torch.gemm_f32_out.default] = gemm_forward
    # The table with the extra random-number decompositions is built once, at the
    # first compile: rebuilt with ours where that compile came before this import.
    inductor.fast_random_decomps.cache_clear()


def _rounding(x: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu":
        return NotImplemented  # the op stays whole, for `_cast_rounding`
    return round_bits(x)


def _register_lowering() -> None:
    # `as`, as in `_register`
    import torch._inductor.lowering as lowering

    lowering.register_lowering(
        torch.ops.sx2torch.round_to_bf16.default, type_promotion_kind=None
    )(lowering.make_pointwise(_cast_rounding))


def _cast_rounding(x):
    from torch._inductor.virtualized import ops

    # The op's input, an f32 value in inductor's IR; use_compute_types=False keeps the cast.
    kept = ops.to_dtype(x, torch.bfloat16, use_compute_types=False)
    return ops.to_dtype(kept, torch.float32, src_dtype=torch.bfloat16)
