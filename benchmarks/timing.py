"""Side-by-side timing of training steps: the variants run interleaved, medians compared."""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


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


def measure(
    runs: list[Variant],
    reps: int,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Warm each variant up, then time `reps` rounds, each round in a rotated order so that
    no variant always runs first (or right after the same other one). `clock`: wall time,
    or `time.process_time` for the CPU time of a process that computes on one thread,
    which the other jobs of a shared machine change less."""
    for run in runs:
        start = clock()
        run.step()
        run.first_s = clock() - start
        for _ in range(warmup - 1):
            run.step()
    for rep in range(reps):
        shift = rep % len(runs)
        for run in runs[shift:] + runs[:shift]:
            start = clock()
            run.step()
            run.times.append(clock() - start)


class PeakMemory(TorchDispatchMode):
    """The most bytes of CPU tensors alive at once among those the ops run under it make
    (the tensors made before it, as the parameters, are not counted): each storage is
    counted once, from the op that makes it until it is freed."""

    def __init__(self):
        super().__init__()
        self.live: dict = {}  # a storage's address -> its bytes
        self.now = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                storage = tensor.untyped_storage()
                address = storage.data_ptr()
                if address and address not in self.live:
                    self.live[address] = storage.nbytes()
                    self.now += storage.nbytes()
                    weakref.finalize(storage, self._free, address)
        self.peak = max(self.peak, self.now)
        return out

    def _free(self, address: int) -> None:
        self.now -= self.live.pop(address)
