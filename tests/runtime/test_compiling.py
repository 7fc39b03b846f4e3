"""Graphs with an f32 island and a runtime autograd function keep the AOTAutograd cache."""

import torch
from torch._dynamo.utils import counters

from sx2torch import runtime as sx


def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = sx.matmul_f32_out(x, w)
    with torch.autocast("cpu", enabled=False):
        return torch.softmax(h, dim=-1).sum()


def test_an_island_and_a_custom_function_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
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
