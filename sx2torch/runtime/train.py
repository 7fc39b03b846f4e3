"""The training loop a generated file runs as a script (its `if __name__ == "__main__":` block).

    python model.py --data GLOB --steps N --out DIR [--resume] [--compile] [--parallel ddp|fsdp2]
    torchrun --nproc-per-node K model.py ... --parallel ddp|fsdp2

`settings` is the literal the compiler wrote from the defrun: the loss method, steps, batch
size and sequence length, schedule, gradient clipping, synthetic inputs, and the optimizers
with the parameters each one updates. Precision is the generated code's own: the loop never
casts parameters or wraps the step in autocast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from tqdm import tqdm

from sx2torch.runtime.data import DataError, Synthetic, TokenShards

__all__ = ["main", "train"]

OPTIMIZERS = {"adamw": torch.optim.AdamW, "muon": torch.optim.Muon}
INTERRUPTED = 130  # the exit status of a run stopped by Ctrl-C, as a shell reports it


def main(model_class: type, settings: dict, argv=None) -> None:
    args = _arguments(settings, argv)
    try:
        sys.exit(train(model_class, settings, args))
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def _arguments(settings: dict, argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train the model with the settings of its defrun."
    )
    tokens = "inputs" not in settings
    parser.add_argument(
        "--data",
        required=tokens,
        metavar="GLOB",
        help="token shards (modded-nanogpt's format)"
        + ("" if tokens else "; ignored: this run draws synthetic :inputs"),
    )
    parser.add_argument("--steps", type=int, default=settings.get("steps"))
    parser.add_argument("--out", default="run", metavar="DIR")
    parser.add_argument("--resume", action="store_true", help="continue from DIR")
    parser.add_argument("--compile", action="store_true", help="torch.compile the loss")
    parser.add_argument("--parallel", choices=("ddp", "fsdp2"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--save-every",
        type=int,
        default=0,
        metavar="N",
        help="also checkpoint every N steps (always at the end and on Ctrl-C)",
    )
    args = parser.parse_args(argv)
    if args.steps is None or args.steps < 1:
        parser.error("give --steps N (N >= 1): the defrun has no :steps")
    return args


def train(model_class: type, settings: dict, args: argparse.Namespace) -> int:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and args.parallel is None:
        raise DataError(f"{world} processes: pass --parallel ddp or --parallel fsdp2")
    if "inputs" in settings:
        batches = Synthetic(settings["inputs"], args.seed, rank, world)
        rows = next(iter(settings["inputs"].values()))["shape"][0]
    else:
        batch_size, seq_len = settings["batch_size"], settings["seq_len"]
        batches = TokenShards(args.data, batch_size, seq_len, rank, world)
        rows = batch_size * seq_len  # tokens per global batch
    out = Path(args.out)
    start = _latest(out) if args.resume else 0
    device = _device()
    if args.parallel:
        _init_process_group(device, rank, world)

    torch.manual_seed(args.seed)  # the same initial parameters on every rank
    model = model_class().to(device)
    objective = Objective(model, settings["loss"])
    if args.parallel == "fsdp2":
        _fully_shard(model)
    elif args.parallel == "ddp":
        objective = nn.parallel.DistributedDataParallel(objective)
    optimizers = _optimizers(model, settings["optimizers"])
    base_lrs = [[g["lr"] for g in o.param_groups] for o in optimizers]
    if start:
        _load(out, start, model, optimizers)
    if args.compile:
        objective = torch.compile(objective)

    steps, clip = args.steps, settings.get("grad_clip")
    schedule = settings.get("schedule", {"warmup": 0.0, "cooldown": 0.0})
    metrics = _metrics(out, start) if rank == 0 else None
    stop = _StopRequest()
    bar = tqdm(total=steps, initial=start, disable=rank != 0, unit="step")
    last, stopping = time.perf_counter(), False
    for step in range(start, steps):
        scale = lr_scale(step, steps, **schedule)
        for optimizer, lrs in zip(optimizers, base_lrs):
            for group, lr in zip(optimizer.param_groups, lrs):
                group["lr"] = lr * scale
        batch = [t.to(device, non_blocking=True) for t in batches(step)]
        loss = objective(*batch)
        if loss.ndim != 0:
            raise DataError(
                f"the loss returned shape {tuple(loss.shape)}: it must be a scalar"
            )
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        # one reduction per step gives every rank the mean loss and any rank's stop request
        report = torch.stack([loss.detach().float(), stop.tensor(device)])
        if args.parallel:
            dist.all_reduce(report)
        loss_value, stopping = report[0].item() / world, report[1].item() > 0
        now = time.perf_counter()
        tokens_per_s, last = rows / (now - last), now
        if metrics:
            record = {"step": step, "loss": loss_value, "lr": scale * base_lrs[0][0]}
            metrics.write(json.dumps(record | {"tokens_per_s": tokens_per_s}) + "\n")
            metrics.flush()
        bar.set_postfix(
            loss=f"{loss_value:.4f}", tok_s=f"{tokens_per_s:.0f}", refresh=False
        )
        bar.update(1)
        done = step + 1
        if (
            stopping
            or done == steps
            or (args.save_every and done % args.save_every == 0)
        ):
            _save(out, done, model, optimizers, rank)
        if stopping:
            break
    bar.close()
    if args.parallel:
        dist.destroy_process_group()
    if stopping and rank == 0:
        print(
            f"interrupted: saved step {done} in {out}; --resume continues",
            file=sys.stderr,
        )
    return INTERRUPTED if stopping else 0


class Objective(nn.Module):
    """`model.<loss>(*batch)` as a module's forward, so that DDP and torch.compile see the
    whole step as one call."""

    def __init__(self, model: nn.Module, loss: str):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *batch):
        return getattr(self.model, self.loss)(*batch)


def lr_scale(step: int, steps: int, warmup: float, cooldown: float) -> float:
    """A linear warmup over the first `warmup` of the steps, then flat, then a linear decay
    over the last `cooldown` (modded-nanogpt's schedule)."""
    progress = step / steps
    if progress < warmup:
        return (step + 1) / (warmup * steps)
    if progress >= 1 - cooldown:
        return (1 - progress) / cooldown
    return 1.0


def _optimizers(model: nn.Module, groups: list) -> list:
    """One optimizer per entry of the settings, over the parameters its patterns name
    (`*` is a layer's index); every trainable parameter must be named exactly once."""
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    claimed: dict = {}
    optimizers = []
    for group in groups:
        options = {k: v for k, v in group.items() if k not in ("name", "params")}
        patterns = [re.escape(p).replace(r"\*", r"\d+") for p in group["params"]]
        params = [
            p for n, p in named.items() if any(re.fullmatch(x, n) for x in patterns)
        ]
        for name, param in named.items():
            if any(param is p for p in params):
                if name in claimed:
                    raise RuntimeError(
                        f"{name} is in both {claimed[name]} and {group['name']}"
                    )
                claimed[name] = group["name"]
        optimizers.append(OPTIMIZERS[group["name"]](params, **options))
    missing = named.keys() - claimed.keys()
    if missing:
        raise RuntimeError(f"no optimizer for {', '.join(sorted(missing))}")
    return optimizers


def _device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _init_process_group(device: torch.device, rank: int, world: int) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "MASTER_ADDR" in os.environ:  # started by torchrun
        dist.init_process_group(
            backend, device_id=device if backend == "nccl" else None
        )
    else:  # one process without torchrun: a group of one, for trying --parallel out
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=rank, world_size=world
        )


def _fully_shard(model: nn.Module) -> None:
    """FSDP2 units: each sub-model (each layer of a stack), then the root. A generated module
    calls its own methods directly (the loss calls `self.forward`; a stack's loop calls a
    layer's `forward_bf16` for a bf16 input), which bypasses FSDP's hooks on `module(...)`,
    so every method a generated class defines is registered as a forward."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    units = [
        block
        for child in model.children()
        for block in (child if isinstance(child, nn.ModuleList) else [child])
    ]
    for unit in [*units, model]:
        methods = _own_methods(type(unit))  # before fully_shard subclasses it
        fully_shard(unit)
        for name in methods:
            register_fsdp_forward_method(unit, name)


def _own_methods(cls: type) -> list:
    """The methods a generated class defines besides `__init__` and `forward`."""
    return [
        name
        for name, value in vars(cls).items()
        if callable(value) and not name.startswith("_") and name != "forward"
    ]


class _StopRequest:
    """Ctrl-C (or torchrun's SIGTERM) asks the loop to save and stop after the current step; a
    second Ctrl-C stops at once."""

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._request)

    def _request(self, signum, frame):
        self.requested = True
        signal.signal(
            signum,
            signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler,
        )

    def tensor(self, device) -> torch.Tensor:
        return torch.tensor(float(self.requested), device=device)


def _metrics(out: Path, start: int):
    """DIR/metrics.jsonl, keeping the records of the steps before `start` (a resumed run
    rewrites the steps after its checkpoint)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "metrics.jsonl"
    kept = []
    if start and path.exists():
        kept = [
            l for l in path.read_text().splitlines() if json.loads(l)["step"] < start
        ]
    path.write_text("".join(line + "\n" for line in kept))
    return path.open("a")


def _save(out: Path, step: int, model, optimizers, rank: int) -> None:
    """A DCP checkpoint in DIR/checkpoints/step-N (each rank writes its own shards), then
    DIR/checkpoints/latest names it, and older ones are removed."""
    folder = out / "checkpoints"
    model_state, optim_state = get_state_dict(model, optimizers)
    with _quiet_without_group():
        dcp.save(
            {"model": model_state, "optim": optim_state},
            checkpoint_id=folder / f"step-{step}",
        )
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        (folder / "latest.tmp").write_text(f"step-{step}\n")
        (folder / "latest.tmp").replace(folder / "latest")
        for old in folder.glob("step-*"):
            if old.name != f"step-{step}":
                shutil.rmtree(old)


def _latest(out: Path) -> int:
    latest = out / "checkpoints" / "latest"
    if not latest.exists():
        raise DataError(f"--resume: no checkpoint in {out}")
    return int(latest.read_text().strip().removeprefix("step-"))


def _load(out: Path, step: int, model, optimizers) -> None:
    model_state, optim_state = get_state_dict(model, optimizers)
    state = {"model": model_state, "optim": optim_state}
    with _quiet_without_group():
        dcp.load(state, checkpoint_id=out / "checkpoints" / f"step-{step}")
    set_state_dict(
        model,
        optimizers,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
    )


@contextlib.contextmanager
def _quiet_without_group():
    """DCP warns when there is no process group that it reads or writes as one process,
    which is what a run without --parallel means."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        yield
