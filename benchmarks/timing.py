"""Side-by-side timing of training steps: the variants run interleaved, medians compared."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class Variant:
    name: str
    step: Callable[[], None]
    times: list[float] = field(default_factory=list)
    first_s: float = 0.0  # the first step, which for a compiled variant compiles


def training_step(
    net: torch.nn.Module, loss_of: Callable, inputs: tuple[torch.Tensor, ...]
) -> Callable[[], None]:
    """One AdamW step: zero the gradients, forward and backward `loss_of(*inputs)`, step."""
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_of(*inputs).backward()
        optimizer.step()

    return step


def measure(runs: list[Variant], reps: int, warmup: int) -> None:
    """Warm each variant up, then time `reps` rounds, each round in a rotated order so that
    no variant always runs first (or right after the same other one)."""
    for run in runs:
        start = time.perf_counter()
        run.step()
        run.first_s = time.perf_counter() - start
        for _ in range(warmup - 1):
            run.step()
    for rep in range(reps):
        shift = rep % len(runs)
        for run in runs[shift:] + runs[:shift]:
            start = time.perf_counter()
            run.step()
            run.times.append(time.perf_counter() - start)
