"""Time a training step (forward, backward, AdamW) on CPU, target by target.

For each model, three variants of the same source are measured side by side in
one process, their repetitions interleaved (the order rotates every round) so
that drift in the machine's speed falls on all of them alike:

- ``cpu``: ``--target cpu`` under the source's ``:bf16`` run (bf16 values held
  in f32 tensors, rounded by ``sx.round_to_bf16``);
- ``native-bf16``: ``--target cuda`` run on CPU (real bf16 tensors and bf16
  GEMMs);
- ``f32``: the same source with its defrun edited to ``:precision :f32``.

Each timing is the CPU time of one step on one thread (``--threads``); the
figure reported is the median over the repetitions. The goals (LANGUAGE.md
section 7): ``cpu / f32 <= 1.3`` and ``native-bf16 / cpu >= 20`` (an AVX2-only
CPU's; one with AVX512-BF16 runs bf16 GEMMs faster than f32 ones).

The Llama port (examples/llama.lisp at benchmarks.models's two-layer size, 2 x
128 tokens) adds ``autocast``: the ``exact`` (f32) run under
``torch.autocast("cpu", dtype=torch.bfloat16)``, and the peak memory of each
variant's forward and backward (the most bytes of tensors the step makes alive
at once: activations, saved values, gradients; the parameters, alike in all,
not counted). Goals (issue 39): ``cpu / f32 <= 1.15`` and the cpu variant's peak
within 1.1x autocast's.

``--profile`` adds a breakdown of the cpu variant's step (the share of
``sx.round_to_bf16``, the top ops), an ablation (the cpu variant with the module's own
``sx.round_to_bf16`` calls, those of its parameters and inputs, done by torch's cast round
trip, and left out; the roundings inside ``sx.store_bf16``, ``sx.to_bf16`` and the
gradient hooks stay), one rounding against one f32 op, and a square GEMM in bf16 against
f32; and the Llama port's roundings in one held step, forward and backward, by what each
is for. ``--compiled`` adds the Llama port's held and f32 steps under ``torch.compile``
(warm steps, side by side), where inductor fuses the roundings into their neighbours.

Run: ``python -m benchmarks.step [--reps 30] [--batch 256] [--no-tiny-gpt]
[--no-llama] [--threads 1] [--profile] [--compiled]``.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Callable

import torch

from sx2torch import runtime
from sx2torch.runtime import rounding as runtime_rounding
from benchmarks.models import MODELS
from benchmarks.timing import PeakMemory, Variant, measure, training_step
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

ROOT = Path(__file__).resolve().parent.parent
RMS_MLP = ROOT / "examples" / "rms-mlp.lisp"
TINY_GPT = ROOT / "examples" / "tiny-gpt.lisp"
LLAMA = ROOT / "examples" / "llama.lisp"


def load(
    source: str,
    filename: str,
    target: str,
    rounding: Callable | None = None,
    run: str | None = None,
) -> types.ModuleType:
    """Compile and import; ``rounding``, if given, replaces ``sx.round_to_bf16``."""
    code = compile_source(source, filename, Options(target=target, run=run))
    module = types.ModuleType(Path(filename).stem.replace("-", "_"))
    exec(compile(code, filename, "exec"), module.__dict__)
    if rounding is not None:
        module.sx = types.SimpleNamespace(**vars(runtime))
        module.sx.round_to_bf16 = rounding
    return module


class _CastRoundTrip(torch.autograd.Function):
    """``x.to(torch.bfloat16).float()`` with the identity gradient, as the helper has."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).float()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def cast_round_trip(x: torch.Tensor) -> torch.Tensor:
    """The ablation's rounding: two passes of torch's own RNE cast, not ~10 int ops."""
    return x.float() if x.dtype == torch.bfloat16 else _CastRoundTrip.apply(x)


def no_rounding(x: torch.Tensor) -> torch.Tensor:
    """The ablation's bound: the held form without the module's own roundings (its
    stores, entry casts and gradient hooks still round, inside the runtime)."""
    return x.float()


def as_f32(source: str) -> str:
    edited = source.replace(":precision :bf16", ":precision :f32")
    if edited == source:
        raise SystemExit("the source has no `:precision :bf16` defrun to edit")
    return edited


def variants(
    path: Path, inputs: tuple[torch.Tensor, ...], ablation: bool = False
) -> list[Variant]:
    """The three variants; with ``ablation``, the cpu one with two other roundings."""
    source = path.read_text(encoding="utf-8")
    made = []
    chosen = [
        ("cpu", source, "cpu", None),
        ("native-bf16", source, "cuda", None),
        ("f32", as_f32(source), "cpu", None),
    ]
    if ablation:
        chosen += [
            ("cpu, cast round trip", source, "cpu", cast_round_trip),
            ("cpu, no rounding", source, "cpu", no_rounding),
        ]
    for name, text, target, rounding in chosen:
        module = load(text, path.name, target, rounding)
        torch.manual_seed(0)
        net = getattr(module, module.__all__[0])()
        made.append(Variant(name, training_step(net, net.loss, inputs)))
    return made


LLAMA_VARIANTS = {  # name -> (target, run)
    "cpu": ("cpu", "train"),
    "native-bf16": ("cuda", "train"),
    "f32": ("cpu", "exact"),
    "autocast": ("cpu", "exact"),
}


def llama_variants(
    inputs: tuple[torch.Tensor, ...], names: tuple[str, ...] = tuple(LLAMA_VARIANTS)
) -> tuple[list[Variant], dict]:
    """The Llama port: its `train` run (bf16) held and native, its `exact` run (f32) as it
    is and under autocast (those `names`); and each one's (module, loss)."""
    source = LLAMA.read_text(encoding="utf-8")
    made, losses = [], {}
    for name in names:
        target, run = LLAMA_VARIANTS[name]
        module = load(source, LLAMA.name, target, run=run)
        torch.manual_seed(0)
        net = module.Llama(**MODELS["llama"][3])  # benchmarks.models's sizes
        loss_of = autocast(net.loss) if name == "autocast" else net.loss
        made.append(Variant(name, training_step(net, loss_of, inputs)))
        losses[name] = net, loss_of
    return made, losses


def compiled_llama(inputs: tuple[torch.Tensor, ...]) -> list[Variant]:
    """The Llama port's held bf16 (`train`) and f32 (`exact`) steps with `torch.compile` of
    the loss, where inductor fuses each rounding into its neighbours' kernels."""
    source = LLAMA.read_text(encoding="utf-8")
    made = []
    for name, run in (("cpu", "train"), ("f32", "exact")):
        module = load(source, LLAMA.name, "cpu", run=run)
        module.__name__ = f"llama_{run}"  # dynamo imports the module its code runs in
        sys.modules[module.__name__] = module
        torch.manual_seed(0)
        net = module.Llama(**MODELS["llama"][3])
        made.append(Variant(name, training_step(net, torch.compile(net.loss), inputs)))
    return made


def autocast(loss_of: Callable) -> Callable:
    def under_autocast(*inputs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return loss_of(*inputs)

    return under_autocast


def peak_memory(losses: dict, inputs: tuple[torch.Tensor, ...]) -> None:
    """Each variant's peak memory over one forward and backward, its gradients unset first,
    against autocast's."""
    peak = {}
    for name, (net, loss_of) in losses.items():
        net.zero_grad(set_to_none=True)
        with PeakMemory() as memory:
            loss_of(*inputs).backward()
        peak[name] = memory.peak
    for name, found in peak.items():
        print(f"  peak memory, {name:12} {found / 2**20:7.2f} MiB")
    ratio = peak["cpu"] / peak["autocast"]
    print(
        f"  cpu / autocast peak memory = {ratio:6.2f}   (goal <= 1.1:"
        f" {'met' if ratio <= 1.1 else 'MISSED'})"
    )


def report(
    title: str, runs: list[Variant], goal: float = 1.3, native: bool = True
) -> dict[str, float]:
    median = {run.name: statistics.median(run.times) for run in runs}
    print(f"\n{title}")
    for run in runs:
        spread = (
            statistics.quantiles(run.times, n=4) if len(run.times) > 1 else [0, 0, 0]
        )
        print(
            f"  {run.name:22} median {median[run.name] * 1e3:9.2f} ms"
            f"   (quartiles {spread[0] * 1e3:.2f} .. {spread[2] * 1e3:.2f} ms,"
            f" n={len(run.times)})"
        )
    for name in median:
        if name.startswith("cpu, "):
            print(f"  ({name}) / f32 = {median[name] / median['f32']:6.2f}")
    cpu_over_f32 = median["cpu"] / median["f32"]
    native_over_cpu = median["native-bf16"] / median["cpu"]
    print(
        f"  cpu / f32         = {cpu_over_f32:6.2f}   (goal <= {goal}:"
        f" {'met' if cpu_over_f32 <= goal else 'MISSED'})"
    )
    if "autocast" in median:
        print(f"  cpu / autocast    = {median['cpu'] / median['autocast']:6.2f}")
    if native:
        print(
            f"  native-bf16 / cpu = {native_over_cpu:6.2f}   (goal >= 20:"
            f" {'met' if native_over_cpu >= 20 else 'MISSED'})"
        )
    else:
        print(f"  native-bf16 / cpu = {native_over_cpu:6.2f}")
    return median


def traced_rounding(x: torch.Tensor) -> torch.Tensor:
    """``sx.round_to_bf16`` inside a profiler range, so its inclusive time shows."""
    with torch.profiler.record_function("sx.round_to_bf16"):
        return runtime.round_to_bf16(x)


def profile(path: Path, inputs: tuple[torch.Tensor, ...], reps: int) -> None:
    """Where the cpu variant's step goes: the rounding's share, then the top ops."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    module = load(path.read_text(encoding="utf-8"), path.name, "cpu", traced_rounding)
    torch.manual_seed(0)
    net = getattr(module, module.__all__[0])()
    step = training_step(net, net.loss, inputs)
    for _ in range(2):
        step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("step"):
            for _ in range(reps):
                step()
    events = {e.key: e for e in prof.key_averages()}
    total = events["step"].cpu_time_total
    rounding = events["sx.round_to_bf16"]
    print(
        f"  profile of the cpu variant, {reps} steps: sx.round_to_bf16 called"
        f" {rounding.count // reps} times a step, {rounding.cpu_time_total / total:.1%}"
        f" of the step ({rounding.cpu_time_total / reps / 1e3:.2f} ms/step)"
    )
    print("    top ops by self CPU time:")
    ops = [e for key, e in events.items() if key.startswith("aten::")]
    for event in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:10]:
        print(
            f"      {event.key:28} {event.self_cpu_time_total / reps / 1e3:8.3f} ms/step"
            f"  x{event.count // reps}"
        )


AGAIN = "a held bf16 value, rounded again"
FUNCTION = torch.autograd.function.__file__  # an autograd Function's apply
# the runtime's functions that round, outermost first (a store calls round_to_bf16)
_SITES = {
    "store_bf16": "a bf16 op's result (sx.store_bf16)",
    "to_bf16": "an argument at entry (sx.to_bf16)",
    "round_to_bf16": "a cast down (sx.round_to_bf16)",
}


def roundings(step: Callable[[], None]) -> collections.Counter:
    """The roundings one call of `step` runs, counted at the runtime's rounding kernel (each
    eager rounding on the CPU, forward and backward, goes through it): by phase and why.
    Forward: the runtime function that rounds (a store, an entry cast, a cast down).
    Backward: the autograd node whose gradient is rounded: a store's hook on its op's node
    (`MmBackward0`: a GEMM's gradients), a value's rounding (`_RoundToBf16Backward`: the
    gradients of a value's reads summed), an f32 island's read (`_AsF32Backward`). A
    gradient that is a held bf16 value already passes without one: one rounded is counted
    as `AGAIN`."""
    found = collections.Counter()
    kernel = runtime_rounding._round

    def counting(x: torch.Tensor) -> torch.Tensor:
        node = torch._C._current_autograd_node()
        phase = "forward" if node is None else "backward"
        if runtime_rounding._is_held(x):
            found[phase, AGAIN] += 1
        elif node is not None:
            found[phase, type(node).__name__] += 1
        else:
            found[phase, _site(sys._getframe(1))] += 1
        return kernel(x)

    runtime_rounding._round = counting
    try:
        step()
    finally:
        runtime_rounding._round = kernel
    return found


def _site(frame) -> str:
    """Why a forward rounding runs: the outermost of the runtime's rounding functions on
    the stack below the module's code."""
    names = set()
    while frame.f_code.co_filename in (runtime_rounding.__file__, FUNCTION):
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return next(why for name, why in _SITES.items() if name in names)


def rounding_inventory(inputs: tuple[torch.Tensor, ...]) -> None:
    """The held Llama step's roundings, by phase and why (`roundings`)."""
    (variant,), _ = llama_variants(inputs, names=("cpu",))
    variant.step()
    found = roundings(variant.step)
    for phase in ("forward", "backward"):
        total = sum(n for (p, _), n in found.items() if p == phase)
        print(f"  {phase}: {total} roundings a step")
        for (p, why), n in sorted(found.items(), key=lambda item: -item[1]):
            if p == phase:
                print(f"    {n:4}  {why}")


def gemm_cost(n: int = 1024, reps: int = 10) -> None:
    """A square bf16 GEMM against the f32 one: the premise of section 7's cpu target."""
    a = torch.randn(n, n)
    b = a.to(torch.bfloat16)
    times = {}
    for label, fn in (("f32", lambda: a @ a), ("bf16", lambda: b @ b)):
        fn()
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        times[label] = statistics.median(samples)
    print(
        f"  {n}x{n} torch.mm: f32 {times['f32'] * 1e3:.2f} ms, bf16"
        f" {times['bf16'] * 1e3:.2f} ms, bf16/f32 = {times['bf16'] / times['f32']:.2f}"
    )


def rounding_cost(shape: tuple[int, ...], reps: int = 50) -> None:
    """One ``round_to_bf16`` against one f32 elementwise op of the same size."""
    from sx2torch.runtime import round_to_bf16

    x = torch.randn(shape)
    cases = {
        "round_to_bf16(x)": lambda: round_to_bf16(x),
        "x.to(bf16).float()": lambda: x.to(torch.bfloat16).float(),
        "x + x (one f32 op)": lambda: x + x,
    }
    print(f"  elementwise cost on {tuple(shape)} f32:")
    for label, fn in cases.items():
        for _ in range(5):
            fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        print(f"    {label:22} {statistics.median(times) * 1e6:9.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--no-tiny-gpt", action="store_true")
    parser.add_argument("--no-llama", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--compiled", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}")
    print(f"CPU capability: {torch.backends.cpu.get_cpu_capability()}")
    print(f"threads: {torch.get_num_threads()}")

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 784, generator=generator)
    labels = torch.randint(0, 10, (args.batch,), generator=generator)
    runs = variants(RMS_MLP, (x, labels), ablation=args.profile)
    measure(runs, args.reps, args.warmup, clock=time.process_time)
    report(f"rms-mlp, batch {args.batch}, one AdamW step", runs)
    if args.profile:
        profile(RMS_MLP, (x, labels), reps=10)
        rounding_cost((args.batch, 784))
        gemm_cost()

    if not args.no_tiny_gpt:
        try:
            batch, time_steps = 8, 64
            idx = torch.randint(0, 512, (batch, time_steps), generator=generator)
            targets = torch.randint(0, 512, (batch, time_steps), generator=generator)
            runs = variants(TINY_GPT, (idx, targets), ablation=args.profile)
        except (OSError, SourceError) as error:
            print(f"\ntiny-gpt skipped: {error}")
        else:
            measure(runs, max(args.reps // 2, 5), args.warmup, clock=time.process_time)
            report(
                f"tiny-gpt, batch {batch} x {time_steps} tokens, one AdamW step", runs
            )
            if args.profile:
                profile(TINY_GPT, (idx, targets), reps=5)

    if not args.no_llama:
        ids = torch.randint(0, 1024, (2, 128), generator=generator)
        targets = torch.randint(0, 1024, (2, 128), generator=generator)
        runs, losses = llama_variants((ids, targets))
        measure(runs, max(args.reps // 2, 5), args.warmup, clock=time.process_time)
        report(
            "llama port, 2 layers, batch 2 x 128 tokens, one AdamW step",
            runs,
            goal=1.15,
            native=False,
        )
        peak_memory(losses, (ids, targets))
        if args.profile:
            rounding_inventory((ids, targets))
        if args.compiled:
            runs = compiled_llama((ids, targets))
            measure(runs, max(args.reps // 2, 5), args.warmup, clock=time.process_time)
            median = {run.name: statistics.median(run.times) for run in runs}
            ratio = median["cpu"] / median["f32"]
            print(
                f"  compiled (torch.compile of the loss, warm steps): cpu"
                f" {median['cpu'] * 1e3:.2f} ms, f32 {median['f32'] * 1e3:.2f} ms,"
                f" cpu / f32 = {ratio:6.2f}   (goal <= 1.15:"
                f" {'met' if ratio <= 1.15 else 'MISSED'})"
            )


if __name__ == "__main__":
    main()
