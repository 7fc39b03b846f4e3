"""Let inductor's AOTAutograd cache keep the graphs of generated modules.

An f32 island is a ``torch.autocast(..., enabled=False)`` block, which dynamo traces
into ``_enter_autocast``/``_exit_autocast`` calls. PyTorch 2.13 leaves both off the
AOTAutograd cache's allowlist (they are private), so every graph with an island
bypassed that cache: each warm start re-traced the joint forward and backward and
re-ran the partitioner (pytorch/pytorch#191106, fixed upstream by adding the two to the
allowlist). They are safe to cache: each only builds an autocast context from its
arguments (device, dtype, enabled), which are constants in the graph and so part of
its cache key. Inductor's own hook for this, ``unsafe_marked_cacheable_functions``,
marks them, keyed by the torch version.

The runtime's custom autograd functions (``matmul_f32_out``, the held targets'
roundings) are traced as ``autograd_function_apply``, which the cache takes only with
``autograd_cache_allow_custom_autograd_functions`` (off by default in 2.13 while PyTorch
tests it; the op was checked pure in pytorch/pytorch#149751). It is switched on unless
its environment variable, TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD, is set.
"""

import os

import torch
import torch._functorch.config
import torch._inductor.config

_AUTOCAST = ("_enter_autocast", "_exit_autocast")


def allow_cached_graphs() -> None:
    if "TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD" not in os.environ:
        torch._functorch.config.autograd_cache_allow_custom_autograd_functions = True
    marked = torch._inductor.config.unsafe_marked_cacheable_functions
    for name in _AUTOCAST:
        marked.setdefault(f"torch.amp.autocast_mode.{name}", torch.__version__)
