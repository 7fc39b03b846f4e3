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
decomposition, so that it fuses the op's plain operations with their neighbours
instead of calling the op. The registrations name only the runtime's own ops:
nothing else compiles differently.

The rounding is inlined in its integer form, which inductor keeps whatever its
settings. Its code is what makes a held target's cold compile slower than cuda's
(nine operations for each rounding in every kernel, where cuda's bf16 code stores
with one cast). Where the user has set ``emulate_precision_casts``, inductor keeps a
``.to(torch.bfloat16).float()`` round trip as eager computes it, and on the CPU that
cast gives the same bits (all 2^32 patterns), so the rounding is inlined as the cast.
"""

import importlib.abc
import importlib.util
import sys

import torch

from sx2torch.runtime.matmul import gemm_forward
from sx2torch.runtime.rounding import round_bits

_AUTOCAST = ("_enter_autocast", "_exit_autocast")
_INDUCTOR = "torch._inductor.decomposition"


def prepare_compiling() -> None:
    """Registers the ops with inductor now if it is loaded, else as soon as it is: importing
    it (dynamo with it) doubles the import time of a process that never compiles."""
    if "torch._inductor" in sys.modules:
        _register()
    else:
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `_register` once inductor's decomposition table is loaded, before any compile."""

    def find_spec(self, name, path, target=None):
        if name != _INDUCTOR:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _register()

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
    if torch._inductor.config.emulate_precision_casts and x.device.type == "cpu":
        return x.to(torch.bfloat16).float()
    return round_bits(x)
