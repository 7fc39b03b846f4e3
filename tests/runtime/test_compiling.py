"""Graphs with an f32 island and the runtime's ops keep the AOTAutograd cache, and
importing the runtime changes no setting for the rest of the process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from sx2torch import runtime as sx

ROOT = Path(__file__).parents[2]


def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = sx.matmul_f32_out(x, w)
    with torch.autocast("cpu", enabled=False):
        return torch.softmax(sx.round_to_bf16(h), dim=-1).sum()


def test_torch_compile_caches_an_island_and_the_runtimes_ops():
    """In the process's own cache folder: a bypass shows at the first compile whether or not
    an earlier run saved the graph, and the second is a hit either way (a fresh folder
    made this test compile inductor's C++ headers again, 10 s)."""
    x = torch.randn(4, 8)
    w = torch.randn(8, 8, requires_grad=True)
    seen = []
    for _ in range(2):
        torch._dynamo.reset()
        counters.clear()
        torch.compile(step, fullgraph=True)(x, w).backward()
        seen.append(dict(counters["aot_autograd"]))
    torch._dynamo.reset()
    assert "autograd_cache_bypass" not in seen[0], seen
    assert seen[1].get("autograd_cache_hit") == 1, seen


def test_importing_the_runtime_changes_no_other_compile_setting():
    """The runtime's ops are cached as ops and rounded as integers: no process-wide
    switch (``autograd_cache_allow_custom_autograd_functions``,
    ``emulate_precision_casts``) changes for the user's other code. The one setting
    added to is the list of cacheable functions, by the two autocast calls."""
    script = """
import json
import torch._functorch.config as functorch
import torch._inductor.config as inductor

def settings():
    return {**functorch.get_config_copy(), **inductor.get_config_copy()}

before = settings()
import sx2torch.runtime
after = settings()
print(json.dumps({k: after[k] for k in after if after[k] != before[k]}, default=repr))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's runtime, not an installed one
    out = subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    changed = json.loads(out.strip().splitlines()[-1])
    assert list(changed) == ["unsafe_marked_cacheable_functions"], changed
    assert set(changed["unsafe_marked_cacheable_functions"]) == {
        "torch.amp.autocast_mode._enter_autocast",
        "torch.amp.autocast_mode._exit_autocast",
    }


def test_the_runtime_loads_inductor_only_for_a_compile():
    """Importing the runtime leaves inductor (and dynamo, about 3 s of a process's start)
    unloaded; the first import of inductor, as torch.compile does, registers the ops."""
    script = """
import sys
import torch
import sx2torch.runtime
print("torch._inductor" in sys.modules, "torch._dynamo" in sys.modules)
import torch._inductor.decomposition as inductor
print(inductor.decompositions[torch.ops.sx2torch.as_f32.default] is torch.clone)
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    ).stdout
    assert out.split() == ["False", "False", "True"]
