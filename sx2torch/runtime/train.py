"""The training loop a generated file runs as a script (its `if __name__ == "__main__":` block).

    python model.py --data GLOB --steps N --out DIR [--resume] [--compile] [--parallel ddp|fsdp2]
    torchrun --nproc-per-node K model.py ... --parallel ddp|fsdp2|tp|fsdp2+tp [--tp N]
    python model.py generate --checkpoint DIR --prompt-ids 1,2,3 (runtime/generate_cli.py)

`settings` is the literal the compiler wrote from the defrun: the loss method, steps, batch
size and sequence length, schedule, gradient clipping, synthetic inputs, and the optimizers
with the parameters each one updates. Precision is the generated code's own: the loop never
casts parameters or wraps the step in autocast.

`--data` is token shards for a loss of (inputs targets) on token data (a defrun without
:inputs), or for any loss named tensors: `.pt` or `.safetensors` files whose keys are the
loss method's arguments. A run with :inputs draws its synthetic batch without `--data`.

A failure the user can act on (the data, the command line, a checkpoint, a full disk, a
non-finite loss) is one line `error: ...` and exit 2; anything else is one line naming the
exception and exit 1, its traceback shown with --traceback. torch.distributed.checkpoint and
tqdm are imported when first needed, so that `--help` and the first step come soon.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import math
import os
import re
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from sx2torch.runtime import checkpoint
from sx2torch.runtime.data import (
    DataError,
    NamedTensors,
    Synthetic,
    TokenShards,
    holds_named_tensors,
)
from sx2torch.runtime.metrics import Metrics, finite_or_null

__all__ = ["main", "train"]

OPTIMIZERS = {"adamw": torch.optim.AdamW, "muon": torch.optim.Muon}
INTERRUPTED = 130  # the exit status of a run stopped by Ctrl-C, as a shell reports it
FAILED = 2  # a failure reported in one line


def main(model_class: type, settings: dict, argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["generate"]:  # the script's other command
        from sx2torch.runtime import generate_cli

        args = generate_cli.arguments(argv[1:])
        encoder_decoder = settings.get("encoder_decoder", False)
        command = functools.partial(
            generate_cli.run, model_class, args, encoder_decoder
        )
        stopped = ""
    else:
        names = loss_arguments(model_class, settings["loss"])
        args = _arguments(settings, names, argv)
        command = functools.partial(train, model_class, settings, args)
        stopped = "; nothing saved since the last checkpoint"
    rank = int(os.environ.get("RANK", 0))
    try:
        sys.exit(command())
    except DataError as error:
        if rank == 0:
            print(f"error: {error}", file=sys.stderr)
        sys.exit(FAILED)
    except KeyboardInterrupt:  # training: a second Ctrl-C, stop at once without saving
        print(f"interrupted: stopped at once{stopped}", file=sys.stderr)
        sys.exit(INTERRUPTED)
    except Exception as error:  # one line, the traceback on request
        if args.traceback:
            raise
        print(
            f"error: {type(error).__name__}: {error} (--traceback shows where)",
            file=sys.stderr,
        )
        sys.exit(1)


def loss_arguments(model_class: type, loss: str) -> list:
    """The names of the loss method's arguments: the keys of named tensors in --data."""
    signature = inspect.signature(getattr(model_class, loss))
    return [
        p.name
        for p in list(signature.parameters.values())[1:]  # after self
        if p.kind == p.POSITIONAL_OR_KEYWORD
    ]


def _arguments(settings: dict, names: list, argv) -> argparse.Namespace:
    parser = _parser(settings, names)
    args = parser.parse_args(argv)
    if args.steps is None or args.steps < 1:
        parser.error("give --steps N (N >= 1): the defrun has no :steps")
    if args.keep < 1:
        parser.error("--keep N needs N >= 1")
    return args


def _parser(settings: dict, names: list) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Train the model with the settings of its defrun.",
        formatter_class=_Help,
        epilog="`generate --help`: the command that generates from a checkpoint. "
        "Outputs, in --out DIR: metrics.jsonl (one JSON object a step), "
        "checkpoints/step-N (the newest --keep, each verified by its manifest.json; "
        "checkpoints/latest names the newest) and, when the run completes, model.pt "
        "(the final weights as one state_dict). Errors are one line: exit 2, or 1 for an "
        "internal one; Ctrl-C saves and exits 130.",
    )
    _what_and_where(parser, settings, names)
    _how(parser)
    _saving(parser)
    return parser


def _what_and_where(parser: argparse.ArgumentParser, settings: dict, names) -> None:
    """The data, the steps, and the folder the run writes to."""
    tokens = "inputs" not in settings
    named = (
        f".pt or .safetensors files of tensors named {', '.join(names)} (batches drawn "
        "along the first axis)"
    )
    parser.add_argument(
        "--data",
        required=tokens,
        metavar="GLOB",
        help=(
            f"token shards (modded-nanogpt's format), or {named}"
            if tokens
            else f"{named}; default: the synthetic :inputs batch"
        ),
    )
    parser.add_argument(
        "--steps", type=int, default=settings.get("steps"), help="steps to train"
    )
    parser.add_argument(
        "--out",
        default="run",
        metavar="DIR",
        help="the run's folder: metrics, checkpoints and final weights (below)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from DIR's newest checkpoint that verifies",
    )


def _how(parser: argparse.ArgumentParser) -> None:
    """How the steps run: compiled, on several processes, from which parameters."""
    parser.add_argument("--compile", action="store_true", help="torch.compile the loss")
    parser.add_argument(
        "--parallel",
        choices=("ddp", "fsdp2", "tp", "fsdp2+tp"),
        help="under torchrun: DistributedDataParallel, FSDP2's fully_shard, tensor "
        "parallelism by the class's TP_PLAN, or both on a 2-D mesh (default: one process)",
    )
    parser.add_argument(
        "--tp",
        type=int,
        help="with --parallel fsdp2+tp: the processes each layer splits across, a divisor "
        "of their count (consecutive ranks); FSDP2 shards across the rest",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the seed of the initial parameters and of the order named tensors are drawn in",
    )
    parser.add_argument(
        "--decay-vectors",
        action="store_true",
        help="apply weight decay to every parameter; by default, as in nanoGPT, only to "
        "matrices and higher, not to vectors and scalars (norm gains, biases, A_log)",
    )


def _saving(parser: argparse.ArgumentParser) -> None:
    """Checkpoints, and what a bad step or an error does."""
    parser.add_argument(
        "--save-every",
        type=int,
        default=0,
        metavar="N",
        help="also checkpoint every N steps (always at the end and on Ctrl-C; 0: never)",
    )
    parser.add_argument(
        "--keep",
        type=int,
        default=2,
        metavar="N",
        help="checkpoints kept: a save removes the oldest beyond N",
    )
    parser.add_argument(
        "--on-nan",
        choices=("stop", "skip"),
        default="stop",
        help="a non-finite loss stops the run, or skips that step's update",
    )
    parser.add_argument(
        "--traceback", action="store_true", help="show the traceback of an error"
    )


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default, where it has one."""

    def _get_help_string(self, action):
        if (
            action.default is None
            or action.default is False
            or "default:" in action.help
        ):
            return action.help
        return super()._get_help_string(action)


def train(model_class: type, settings: dict, args: argparse.Namespace) -> int:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and args.parallel is None:
        raise DataError(f"{world} processes: pass --parallel ddp or --parallel fsdp2")
    tp = _tp_size(args, world)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out}: a file, not a folder")
    names = loss_arguments(model_class, settings["loss"])
    # the ranks of one tensor-parallel group read the same batches
    batches, rows = _batches(settings, args, names, rank // tp, world // tp)
    device = _device()
    owned = args.parallel and not dist.is_initialized()  # else the caller's group
    if owned:
        from sx2torch.runtime.parallel import init_process_group

        init_process_group(device, rank, world)
    torch.manual_seed(args.seed)  # the same initial parameters on every rank
    run = _Run(model_class(), settings, args, device, rank, world, tp)
    run.prepare(batches)
    code = run.loop(batches, rows)
    if owned:
        # every rank done with every collective before any tears its groups down: a rank of
        # a 4-process fsdp2+tp run on gloo aborted (std::terminate) at its exit without this
        dist.barrier()
        dist.destroy_process_group()
    return code


def _tp_size(args, world: int) -> int:
    """How many processes each linear layer splits across (1: none)."""
    if args.tp is not None and args.parallel != "fsdp2+tp":
        raise DataError("--tp N goes with --parallel fsdp2+tp")
    if args.parallel == "tp":
        return world
    if args.parallel != "fsdp2+tp":
        return 1
    if args.tp is None or args.tp < 1 or world % args.tp:
        raise DataError(
            f"--parallel fsdp2+tp needs --tp N, a divisor of the {world} processes"
        )
    return args.tp


def _batches(settings: dict, args, names: list, rank: int, world: int) -> tuple:
    """This rank's batches, and how many tokens (token shards) or rows (the others) one
    global batch holds."""
    inputs = settings.get("inputs")
    # the global batch: :batch-size sequences, or the rows of :inputs' first input
    if inputs is None:
        rows = settings["batch_size"]
    else:
        rows = next(iter(inputs.values()))["shape"][0]
    if args.data is None:  # only a run with :inputs: token data needs --data
        return Synthetic(inputs, args.seed, rank, world), rows
    if holds_named_tensors(args.data):
        return NamedTensors(args.data, names, rows, args.seed, rank, world), rows
    if inputs is not None:
        # token shards would give (inputs targets) to any two arguments: a (src tgt) pair
        raise DataError(
            f"--data {args.data}: the loss takes {', '.join(names)}: give .pt or "
            ".safetensors files of tensors with these names (token shards feed only a run "
            "without :inputs)"
        )
    seq_len = settings["seq_len"]
    return TokenShards(args.data, rows, seq_len, rank, world), rows * seq_len


class _Run:
    """One run's model, optimizers and outputs, from its first step to its last."""

    def __init__(self, model, settings, args, device, rank, world, tp=1):
        self.model, self.settings, self.args = model.to(device), settings, args
        self.device, self.rank, self.world = device, rank, world
        self.tp = tp  # the processes each linear layer splits across
        self.out = Path(args.out)
        self.start, self.checkpoint = 0, None  # the last checkpoint saved or resumed
        self.out_of_range = None  # what an index out of range says about --data
        self.bar = None  # tqdm's, on rank 0 while the loop runs

    def warn(self, line: str) -> None:
        if self.rank == 0:
            (self.bar.write if self.bar else print)(f"warning: {line}", file=sys.stderr)

    def prepare(self, batches) -> None:
        self.out_of_range = getattr(batches, "out_of_range", None)  # None: synthetic
        self.model_id = checkpoint.identity(self.model)  # before sharding: whole shapes
        if self.args.resume:
            self.checkpoint = _agreed(
                lambda: checkpoint.resume_point(self.out, self.model_id, self.warn)
            )
            if checkpoint.source_changed(self.checkpoint, self.model_id):
                self.warn(
                    f"{self.checkpoint} was saved by another version of "
                    f"{type(self.model).__name__}'s file; its parameters match"
                )
            self.start = int(self.checkpoint.name.removeprefix("step-"))
        self.objective = Objective(self.model, self.settings["loss"])
        meshes = self._tensor_parallel()
        if self.args.parallel in ("fsdp2", "fsdp2+tp"):
            from sx2torch.runtime.parallel import fully_shard_units

            first = self._batch(batches, self.start)
            fully_shard_units(
                self.model, lambda: self._forward(first, self.start), meshes.get("dp")
            )
        elif self.args.parallel == "ddp":
            self.objective = nn.parallel.DistributedDataParallel(self.objective)
        self.optimizers = _optimizers(
            self.model, self.settings["optimizers"], self.args.decay_vectors
        )
        self.base_lrs = [[g["lr"] for g in o.param_groups] for o in self.optimizers]
        if self.checkpoint:
            decays = [
                [g["weight_decay"] for g in o.param_groups] for o in self.optimizers
            ]
            checkpoint.load(self.checkpoint, self.model, self.optimizers)
            # loading sets the saved groups' weight decay: this run's settings and flags hold
            for optimizer, chosen in zip(self.optimizers, decays):
                for group, decay in zip(optimizer.param_groups, chosen):
                    group["weight_decay"] = decay
        if self.args.compile:
            self.objective = torch.compile(self.objective)

    def _tensor_parallel(self) -> dict:
        """Split the linear layers across each group of `tp` consecutive ranks; the mesh
        of the groups ("dp") for FSDP2. Empty without tensor parallelism."""
        if "tp" not in (self.args.parallel or "").split("+"):
            return {}
        from torch.distributed.device_mesh import init_device_mesh

        from sx2torch.runtime.parallel import tensor_parallel

        shape = (self.world // self.tp, self.tp)
        mesh = init_device_mesh(self.device.type, shape, mesh_dim_names=("dp", "tp"))
        try:
            tensor_parallel(self.model, mesh["tp"])
        except ValueError as error:
            raise DataError(f"--parallel {self.args.parallel}: {error}") from None
        # A split layer gives its share as a view (DTensor.to_local); FSDP2 warns that an
        # in-place op on it would skip a gather, and generated code makes none.
        warnings.filterwarnings("ignore", "FSDP2-wrapped module .* returned a view")
        return {"dp": mesh["dp"]}

    def loop(self, batches, rows: int) -> int:
        args, steps = self.args, self.args.steps
        clip = self.settings.get("grad_clip")
        schedule = self.settings.get("schedule", {"warmup": 0.0, "cooldown": 0.0})
        metrics = None
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            metrics = Metrics(self.out / "metrics.jsonl", self.start, self.warn)
        bar = self.bar = _bar(steps, self.start) if self.rank == 0 else None
        stop, last, done, stopping = (
            _StopRequest(),
            time.perf_counter(),
            self.start,
            False,
        )
        try:
            for step in range(self.start, steps):
                scale = lr_scale(step, steps, **schedule)
                loss, stopping = self._step(
                    self._batch(batches, step), step, scale, clip, stop
                )
                now = time.perf_counter()
                tokens_per_s, last, done = rows / (now - last), now, step + 1
                self._report(metrics, step, loss, scale, tokens_per_s)
                if (
                    stopping
                    or done == steps
                    or (args.save_every and done % args.save_every == 0)
                ):
                    self.save(done)
                if stopping:
                    break
        finally:
            stop.restore()
            if bar:
                bar.close()
                self.bar = None
            if metrics:
                metrics.close()
        return self._finish(done, stopping)

    def _report(self, metrics, step: int, loss: float, scale: float, rate: float):
        """A step's metrics and progress; a loss not finite stops the run, or is skipped."""
        record = finite_or_null({"step": step}, "loss", loss)
        if not math.isfinite(loss):
            record["skipped"] = self.args.on_nan == "skip"
        record |= {"lr": scale * self.base_lrs[0][0], "tokens_per_s": rate}
        if metrics:
            metrics.write(record)
        if not math.isfinite(loss):
            self._nonfinite(step, loss)
        if self.bar:
            self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{rate:.0f}", refresh=False)
            self.bar.update(1)

    def _finish(self, done: int, stopping: bool) -> int:
        """After the loop: the final weights when every step ran, and what happened."""
        if done == self.args.steps:
            checkpoint.export(self.model, self.out / "model.pt")
        if self.rank == 0:
            said = "interrupted: saved" if stopping else "done:"
            print(
                f"{said} step {done} in {self.checkpoint}"
                + (
                    "; --resume continues"
                    if stopping
                    else f", the final weights in {self.out / 'model.pt'}"
                ),
                file=sys.stderr,
            )
        return INTERRUPTED if stopping else 0

    def _step(self, batch, step: int, scale: float, clip, stop) -> tuple:
        """One step; (the mean loss over the ranks, whether any rank asked to stop). A step
        whose loss is not finite updates nothing."""
        for optimizer, lrs in zip(self.optimizers, self.base_lrs):
            for group, lr in zip(optimizer.param_groups, lrs):
                group["lr"] = lr * scale
        loss = self._forward(batch, step)
        loss.backward()
        # one reduction per step gives every rank the mean loss and any rank's stop request
        report = torch.stack([loss.detach().float(), stop.tensor(self.device)])
        if self.args.parallel:
            dist.all_reduce(report)
        mean, stopping = report[0].item() / self.world, report[1].item() > 0
        if math.isfinite(mean):
            if clip is not None:
                _clip_grad_norm(list(self.model.parameters()), clip)
            for optimizer in self.optimizers:
                optimizer.step()
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        return mean, stopping

    def _forward(self, batch, step: int) -> torch.Tensor:
        try:
            loss = self.objective(*batch)
        except IndexError as error:  # out of an embedding's rows: the data's doing
            if self.out_of_range is None:
                raise
            raise DataError(f"step {step}: {error} ({self.out_of_range})") from None
        if loss.ndim != 0:
            raise DataError(
                f"the loss returned shape {tuple(loss.shape)}: it must be a scalar"
            )
        return loss

    def _batch(self, batches, step: int) -> list:
        return [t.to(self.device, non_blocking=True) for t in batches(step)]

    def _nonfinite(self, step: int, loss: float) -> None:
        if self.args.on_nan == "skip":
            self.warn(
                f"step {step}: the loss is {loss}; the step is skipped (--on-nan skip)"
            )
            return
        last = (
            f"the last good checkpoint is {self.checkpoint}"
            if self.checkpoint
            else "no checkpoint was saved"
        )
        raise DataError(
            f"step {step}: the loss is {loss}; the run stops, {last} "
            "(--on-nan skip skips such steps)"
        )

    def save(self, step: int) -> None:
        self.checkpoint = checkpoint.save(
            self.out, step, self.model, self.optimizers, self.model_id, self.args.keep
        )


def _clip_grad_norm(params: list, clip: float) -> None:
    """nn.utils.clip_grad_norm_, also where tensor parallelism split some parameters and
    left others whole (DTensors beside tensors) or FSDP2 sharded both (DTensors on the 2-D
    mesh and on its dp mesh): torch's norm of all the gradients at once refuses a mix, so
    each DTensor gradient's norm is completed first."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    meshes = {g.device_mesh if isinstance(g, DTensor) else None for g in grads}
    if len(meshes) <= 1:
        nn.utils.clip_grad_norm_(params, clip)
        return
    norms = [torch.linalg.vector_norm(g) for g in grads]
    norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]
    total = torch.linalg.vector_norm(torch.stack(norms))
    scale = torch.clamp(clip / (total + 1e-6), max=1.0).item()  # torch's coefficient
    for grad in grads:
        grad.mul_(scale)


def _agreed(find):
    """`find()` on rank 0, its answer (or its one-line error) given to every rank."""
    answer = error = None
    if not dist.is_initialized() or dist.get_rank() == 0:
        try:
            answer = find()
        except DataError as failure:
            error = failure
    if dist.is_initialized():
        shared = [answer, error]
        dist.broadcast_object_list(shared, src=0)
        answer, error = shared
    if error:
        raise error
    return answer


def _bar(steps: int, start: int):
    from tqdm import tqdm

    return tqdm(total=steps, initial=start, unit="step")


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


def _optimizers(model: nn.Module, groups: list, decay_vectors: bool = False) -> list:
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
        if options.get("weight_decay"):
            params = _decay_groups(params, options["weight_decay"], decay_vectors)
        optimizers.append(OPTIMIZERS[group["name"]](params, **options))
    missing = named.keys() - claimed.keys()
    if missing:
        raise RuntimeError(f"no optimizer for {', '.join(sorted(missing))}")
    return optimizers


def _decay_groups(params: list, decay: float, decay_vectors: bool) -> list:
    """nanoGPT's split: weight decay for matrices and higher (weights, embeddings), none for
    vectors and scalars (norm gains, biases, A_log) unless `decay_vectors`. The two groups
    are made either way, so that a checkpoint resumes with the flag changed."""
    groups = [
        {"params": [p for p in params if p.ndim >= 2]},
        {
            "params": [p for p in params if p.ndim < 2],
            "weight_decay": decay if decay_vectors else 0.0,
        },
    ]
    return [g for g in groups if g["params"]]


def _device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


class _StopRequest:
    """Ctrl-C (or torchrun's SIGTERM) asks the loop to save and stop after the current step; a
    second Ctrl-C stops at once."""

    def __init__(self):
        self.requested = False
        self.before = {
            sig: signal.signal(sig, self._request)
            for sig in (signal.SIGINT, signal.SIGTERM)
        }

    def restore(self) -> None:
        for sig, handler in self.before.items():
            signal.signal(sig, handler)

    def _request(self, signum, frame):
        self.requested = True
        signal.signal(
            signum,
            signal.SIG_DFL if signum == signal.SIGTERM else signal.default_int_handler,
        )

    def tensor(self, device) -> torch.Tensor:
        return torch.tensor(float(self.requested), device=device)
