"""The GPU check: what the CPU suite cannot show, in one run, one table.

1. ``targets``: every golden case and example the target-equivalence table can call,
   compiled for ``--target cuda`` and run against its held ``--target cpu`` module on the
   device, with integer-valued parameters and inputs and with the seeded ones. Where every
   bf16 GEMM and sum of the cuda module adds integers exact in f32 (tests/bitwise.py's
   ``exact_in_any_order``: then any order gives the same bits), the outputs must be
   bit-equal; elsewhere the GPU's summation order is its own, and the row gives the
   distance in U, ``||cuda - cpu|| / ||cpu||`` over bf16's unit roundoff 2^-8.
2. ``matmul_f32_out``: ``sx.matmul_f32_out`` (on CUDA ``aten::mm.dtype``, seen through a
   dispatch mode) against the f32 GEMM of its bf16 operands (TF32 off), its gradients
   against bf16 GEMMs of the rounded incoming gradient, and its time against a bf16 GEMM.
3. ``step``: a training step (forward, backward, AdamW) of tiny-gpt, the modded-nanogpt
   medium port and Llama, generated against hand-written (``benchmarks/gpt.py``'s
   ReferenceGpt, tests/reference's port of modded-nanogpt, transformers'
   LlamaForCausalLM under bf16 autocast), eager and ``torch.compile``d, median times, their
   ratio and each one's peak memory.
4. ``script``: the generated tiny-gpt training script: one process, then torchrun with one
   process under DDP and FSDP2 (nccl on CUDA, gloo on the CPU), and two processes where
   two GPUs exist.
5. ``generate``: benchmarks.generate's Llama (its default size on a GPU, the suite's on the
   CPU), f32 and bf16: tokens per second of sx2torch's and transformers' generate, eager
   and with the static cache compiled (on a GPU both as CUDA graphs), the tokens checked
   against transformers' eager ones, and on a GPU the graphs inductor could not capture.

Every section checks the time left first (``--budget``, default 480 s) and says what it
skipped. ``--device cpu`` runs the same on small configurations, without torch.compile
and torchrun (``--compile`` and ``--torchrun`` force them), so the check is known to work
before a GPU is at hand (tests/test_gpu_check.py).

Run: ``python -m benchmarks.gpu [--device cuda|cpu] [--json PATH] [--budget S]
[--only SECTION ...]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.gpt import ReferenceGpt, import_generated, load_tiny_gpt
from benchmarks.timing import Variant, measure, training_step
from sx2torch import runtime as sx
from sx2torch.compiler import Options, compile_source

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "targets")]
U = 2.0**-8  # bf16's unit roundoff


class Check:
    """The rows of the table, the clock, and what was skipped."""

    def __init__(self, device: str, budget: float, compile_: bool, torchrun: bool):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.compile, self.torchrun = compile_, torchrun
        self.deadline = time.monotonic() + budget
        self.rows: list[dict] = []
        self.skipped: list[str] = []

    def add(self, section: str, name: str, value, note: str = "") -> None:
        self.rows.append(dict(section=section, name=name, value=value, note=note))

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def section(self, name: str, needs_s: float, run: Callable[[], None]) -> None:
        if self.left() < needs_s:
            self.skipped.append(
                f"{name}: {self.left():.0f} s left, needs {needs_s:.0f}"
            )
            return
        try:
            run()
        except Exception as error:  # one failing section must not hide the others
            self.add(name, "error", f"{type(error).__name__}: {error}"[:200])

    def failures(self) -> list[dict]:
        """The rows that say something is wrong: an error, a failed run, a difference."""
        bad = ("error", "FAILED", "DIFFERS", False)
        return [r for r in self.rows if r["value"] in bad or r["name"] == "error"]

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def distance_in_u(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.detach().double(), expected.detach().double()
    return float((a - e).norm() / e.norm().clamp_min(1e-300)) / U


# --- 1. cuda against its held form -------------------------------------------


def targets(check: Check) -> None:
    import test_target_equivalence as table

    for case in table.CASES:
        if check.left() < 20:
            check.skipped.append(f"targets: {case} and after (time)")
            return
        if case in table.SKIPPED:
            check.add("targets", case, "not compared", table.SKIPPED[case][:60])
            continue
        check.add("targets", case, *compare_case(check, table, case))


def compare_case(check: Check, table, case: str) -> tuple[str, str]:
    """The integer run: "bit-equal", "DIFFERS" where exact by construction, else the
    distance in U; the note: the seeded run's largest distance in U."""
    found = {}
    for integer in (True, False):
        made = table.nets(case)
        for net in made.values():
            if integer:
                table.integer_parameters(net)
            net.to(check.device)
        worst, same, sums = 0.0, True, ExactSums()
        for name in table.shared_methods(made, case):
            args = [a.to(check.device) for a in table.arguments(case, name, "cuda")]
            with torch.no_grad(), sums:
                cudas = _values(table.method(made["cuda"], name)(*args))
            args = [a.to(check.device) for a in table.arguments(case, name, "cpu")]
            with torch.no_grad():
                helds = _values(table.method(made["cpu"], name)(*args))
            for cuda, held in zip(cudas, helds):
                cuda = cuda.float() if cuda.is_floating_point() else cuda
                same &= torch.equal(table.bits(cuda), table.bits(held))
                worst = max(worst, distance_in_u(cuda, held))
        found[integer] = same, worst, sums.inexact == 0
    same, worst, exact = found[True]
    value = "bit-equal" if same else ("DIFFERS" if exact else f"{worst:.3g} U")
    return value, f"seeded: {found[False][1]:.3g} U" + (
        "" if exact else "; order-dependent"
    )


def _values(result) -> list:
    """A method's values: a defun may return several, as a tuple."""
    return list(result) if isinstance(result, tuple) else [result]


class ExactSums(TorchDispatchMode):
    """Count the bf16 GEMMs and sums whose partial sums are not all exact in f32."""

    def __init__(self):
        super().__init__()
        self.inexact = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from bitwise import GEMMS, SUMS, exact_in_any_order

        kwargs = kwargs or {}
        bf16 = any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args
        )
        if (
            bf16
            and func in (*GEMMS, *SUMS)
            and not exact_in_any_order(func, args, kwargs)
        ):
            self.inexact += 1
        return func(*args, **kwargs)


# --- 2. sx.matmul_f32_out ------------------------------------------------------


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(str(func))
        return func(*args, **(kwargs or {}))


def matmul(check: Check, n: int) -> None:
    generator = torch.Generator().manual_seed(0)
    a, b, g = (torch.randn(n, n, generator=generator) for _ in range(3))
    a, b = (t.bfloat16().to(check.device).requires_grad_() for t in (a, b))
    g = g.to(check.device)
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is a true f32 GEMM
    try:
        with Ops() as ops:
            out = sx.matmul_f32_out(a, b)
        grad_a, grad_b = torch.autograd.grad(out, (a, b), g)
        expected = a.detach().float() @ b.detach().float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    gemms = sorted(op for op in ops.seen if op.split(".")[1] in ("mm", "bmm", "matmul"))
    if check.cuda:  # elsewhere the f32 GEMM of the bf16 values
        check.add("matmul", "forward via aten::mm.dtype", "aten.mm.dtype" in ops.seen)
    check.add("matmul", "forward's GEMM", ", ".join(gemms))
    check.add(
        "matmul", "forward vs f32 GEMM (U)", f"{distance_in_u(out, expected):.3g}"
    )
    rounded = g.bfloat16()
    same = torch.equal(grad_a, rounded @ b.detach().t()) and torch.equal(
        grad_b, a.detach().t() @ rounded
    )
    check.add("matmul", "backward = bf16 GEMMs", same, f"{n}x{n}")
    timed = {
        "f32-out": lambda: sx.matmul_f32_out(a.detach(), b.detach()),
        "bf16": lambda: a.detach() @ b.detach(),
    }
    reps = 20 if check.cuda else 3
    medians = {name: median_time(check, fn, reps) for name, fn in timed.items()}
    for name, seconds in medians.items():
        check.add("matmul", f"time {name} (ms)", f"{1e3 * seconds:.3f}")
    check.add("matmul", "f32-out / bf16", f"{medians['f32-out'] / medians['bf16']:.2f}")


def median_time(check: Check, fn: Callable, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        check.synchronize()
        start = time.perf_counter()
        fn()
        check.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# --- 3. training steps ------------------------------------------------------------


def compiled_module(path: Path, **consts) -> torch.nn.Module:
    code = compile_source(path.read_text(encoding="utf-8"), path.name, Options())
    module = import_generated(code, "sx_" + path.stem.replace("-", "_"))
    torch.manual_seed(0)
    return getattr(module, module.__all__[0])(**consts)


def tiny_gpt_pair(check: Check, small: bool):
    config = dict(vocab=128, d=64) if small else {}
    generated = load_tiny_gpt().TinyGpt(**config)
    reference = ReferenceGpt(**config)
    reference.load_state_dict(generated.state_dict())
    shape = (2, 32) if small else (8, 256)
    vocab = config.get("vocab", 512)
    return generated, reference, lambda m, i, t: m.loss(i, t), shape, vocab


def medium_pair(check: Check, small: bool):
    from reference.modded_nanogpt_medium import build_reference

    sizes = dict(vocab_size=300, num_layers=16, num_heads=2, head_dim=32, model_dim=64)
    if not small:
        sizes = dict(vocab_size=50304, num_heads=8, head_dim=128, model_dim=1024)
    reference = build_reference(**sizes, max_seq_len=1024)
    windows = dict(ws_short=44, ws_long=92) if small else {}
    path = ROOT / "examples" / "modded-nanogpt-medium.lisp"
    generated = compiled_module(path, **sizes, max_seq_len=1024, **windows)
    generated.load_state_dict(reference.state_dict(), strict=True)

    def loss(model, ids, targets):
        if model is generated:
            return model.loss(ids, targets)
        logits = model(ids).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")

    shape = (1, 64) if small else (1, 1024)
    return generated, reference, loss, shape, sizes["vocab_size"]


def llama_pair(check: Check, small: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = dict(
        vocab_size=256 if small else 32000,
        hidden_size=64 if small else 1024,
        intermediate_size=128 if small else 2816,
        num_hidden_layers=2 if small else 8,
        num_attention_heads=4 if small else 16,
        num_key_value_heads=2 if small else 8,
    )
    sizes["head_dim"] = sizes["hidden_size"] // sizes["num_attention_heads"]
    torch.manual_seed(0)
    reference = LlamaForCausalLM(LlamaConfig(**sizes, attn_implementation="sdpa"))
    generated = compiled_module(ROOT / "examples" / "llama.lisp", **sizes)
    generated.load_state_dict(reference.state_dict(), strict=True)
    device_type = check.device.type

    def loss(model, ids, targets):
        if model is generated:
            return model.loss(ids, targets)
        with torch.autocast(device_type, dtype=torch.bfloat16):
            logits = model(ids).logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    shape = (2, 32) if small else (4, 512)
    return generated, reference, loss, shape, sizes["vocab_size"]


MODELS = {"tiny-gpt": tiny_gpt_pair, "medium": medium_pair, "llama": llama_pair}


def steps(check: Check, small: bool, reps: int) -> None:
    for name, make in MODELS.items():
        need = 15 if small else 60
        check.section(
            f"step {name}", need, lambda: step_model(check, name, make, small, reps)
        )


def step_model(check: Check, name: str, make, small: bool, reps: int) -> None:
    generated, reference, loss, shape, vocab = make(check, small)
    warmup = 1 if small else 3  # a compiled variant compiles in its first step
    generator = torch.Generator().manual_seed(1)
    ids, targets = (
        torch.randint(0, vocab, shape, generator=generator).to(check.device)
        for _ in range(2)
    )
    modes = ["eager"] + (["compiled"] if check.compile else [])
    if not check.compile:
        check.skipped.append(f"step {name}: torch.compile (pass --compile)")
    medians = {}
    pairs = (
        ("generated", generated, reference),
        ("hand-written", reference, generated),
    )
    for mode in modes:
        for who, model, other in pairs:
            # a variant's peak: its weights, gradients, AdamW state and activations
            other.to("cpu")
            model.to(check.device).zero_grad(set_to_none=True)
            fn = (lambda m: lambda i, t: loss(m, i, t))(model)
            if mode == "compiled":
                fn = torch.compile(fn)
            step = training_step(model, fn, (ids, targets))
            variant = Variant(f"{who} {mode}", step)
            peak = peak_memory(check, lambda: measure([variant], reps, warmup))
            medians[who, mode] = statistics.median(variant.times)
            note = f"peak {peak}; first step {variant.first_s:.2f} s"
            check.add(
                f"step {name}",
                variant.name + " (ms)",
                f"{1e3 * medians[who, mode]:.2f}",
                note,
            )
        ratio = medians["generated", mode] / medians["hand-written", mode]
        check.add(f"step {name}", f"generated / hand-written, {mode}", f"{ratio:.3f}")


def peak_memory(check: Check, run: Callable[[], None]) -> str:
    if not check.cuda:
        run()
        return "n/a on cpu"
    torch.cuda.reset_peak_memory_stats(check.device)
    run()
    return f"{torch.cuda.max_memory_allocated(check.device) / 2**20:.1f} MiB"


# --- 4. the training script --------------------------------------------------------


def script(check: Check) -> None:
    from sx2torch.runtime.data import write_shard

    text = (ROOT / "examples" / "tiny-gpt.lisp").read_text(encoding="utf-8")
    for old, new in (
        ("(defconst vocab 512)", "(defconst vocab 64)"),
        ("(defconst d 128)", "(defconst d 32)"),
        (":seq-len 64", ":seq-len 16"),
        (":steps 50", ":steps 6"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    (work / "gpt.py").write_text(
        compile_source(text, "tiny-gpt.lisp"), encoding="utf-8"
    )
    write_shard(work / "shard_000.bin", torch.randint(0, 64, (20000,)))
    runs = [("one process", 1, None)]
    if check.torchrun or check.cuda:
        runs += [("torchrun 1, ddp", 1, "ddp"), ("torchrun 1, fsdp2", 1, "fsdp2")]
    else:
        check.skipped.append("script: torchrun on the CPU (pass --torchrun)")
    if check.cuda and torch.cuda.device_count() >= 2:
        runs += [("torchrun 2, ddp", 2, "ddp"), ("torchrun 2, fsdp2", 2, "fsdp2")]
    elif check.cuda:
        check.skipped.append("script: two processes (one GPU)")
    for label, procs, parallel in runs:
        if check.left() < 40:
            check.skipped.append(f"script: {label} and after (time)")
            return
        check.add("script", label, *train_script(check, work, label, procs, parallel))


def train_script(check, work: Path, label: str, procs: int, parallel) -> tuple:
    out = label.replace(" ", "-").replace(",", "")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    if not check.cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the script takes a GPU whenever it sees one
    command = [sys.executable]
    if parallel is not None:
        command += [
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={procs}",
        ]
    command += ["gpt.py", "--data", "shard_*.bin", "--out", out]
    command += ["--parallel", parallel] if parallel else []
    start = time.perf_counter()
    done = subprocess.run(
        command,
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=max(check.left(), 1),
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        return "FAILED", (
            done.stderr.strip().splitlines()[-1][:120] if done.stderr else ""
        )
    records = [
        json.loads(line)
        for line in (work / out / "metrics.jsonl").read_text().splitlines()
    ]
    backend = "nccl" if check.cuda and parallel else ("gloo" if parallel else "-")
    return (
        f"loss {records[0]['loss']:.3f} -> {records[-1]['loss']:.3f}",
        f"{len(records)} steps, {seconds:.1f} s, {backend}",
    )


# --- 5. generation -------------------------------------------------------------------


def generation(check: Check, new_tokens: int) -> None:
    from torch._dynamo.utils import counters

    from benchmarks import generate as bench

    sizes = bench.SIZES["default" if check.cuda else "ci"]
    if not check.compile:
        check.skipped.append("generate: the compiled static cache (pass --compile)")
    ids = torch.randint(
        0, sizes["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(0)
    ).to(check.device)
    for precision in bench.PRECISIONS:
        section = f"generate {precision}"
        theirs, ours = bench.models(precision, sizes, check.device.type)
        runs = bench.variants(theirs, ours, new_tokens, compiled=check.compile)
        counters.clear()
        try:
            medians = bench.measure(runs, ids, repeat=3 if check.cuda else 1)
        except SystemExit as differs:  # its tokens are not transformers' eager ones
            check.add(section, "tokens", "DIFFERS", str(differs))
            continue
        for name, seconds in medians.items():
            check.add(section, f"{name} (tok/s)", f"{new_tokens / seconds:.1f}")
        if check.compile:
            compiled = medians["sx2torch compiled"]
            for other in ("sx2torch eager", "transformers compiled"):
                speed = medians[other] / compiled
                check.add(section, f"sx2torch compiled, x {other}", f"{speed:.2f}")
        if check.cuda:  # inductor counts each graph it could not capture
            skips = counters["inductor"]["cudagraph_skips"]
            check.add(section, "CUDA graph skips", "FAILED" if skips else "none")


# --- the table ------------------------------------------------------------------------


def table(check: Check) -> str:
    width = (
        max(len(f"{r['section']}  {r['name']}") for r in check.rows)
        if check.rows
        else 10
    )
    lines = [f"GPU check on {device_name(check)}, torch {torch.__version__}"]
    for r in check.rows:
        lines.append(
            f"{r['section'] + '  ' + r['name']:<{width}}  {r['value']!s:<14} {r['note']}"
        )
    lines += [f"skipped: {s}" for s in check.skipped] or ["skipped: nothing"]
    return "\n".join(lines)


def device_name(check: Check) -> str:
    if check.cuda:
        return f"{torch.cuda.get_device_name(check.device)} ({torch.cuda.device_count()} GPUs)"
    return f"cpu ({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"


SECTIONS = ("targets", "matmul", "step", "script", "generate")


def main(argv: list[str] | None = None) -> Check:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda" if torch.cuda.is_available() else "cpu",
    )
    parser.add_argument("--json", metavar="PATH", type=Path)
    parser.add_argument(
        "--budget", type=float, default=480.0, help="seconds (default 480)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile on the CPU too"
    )
    parser.add_argument(
        "--torchrun", action="store_true", help="torchrun on the CPU too"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS,
        default=SECTIONS,
        help="run these sections alone",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device (use --device cpu)")
    cuda = args.device == "cuda"
    check = Check(args.device, args.budget, args.compile or cuda, args.torchrun)
    small = not cuda
    if "targets" in args.only:
        check.section("targets", 30, lambda: targets(check))
    if "matmul" in args.only:
        check.section("matmul", 10, lambda: matmul(check, 4096 if cuda else 128))
    if "step" in args.only:
        steps(check, small, reps=20 if cuda else 1)
    if "script" in args.only:
        check.section("script", 40, lambda: script(check))
    if "generate" in args.only:
        check.section("generate", 60, lambda: generation(check, 32))
    print(table(check))
    if args.json:
        device = device_name(check)
        args.json.write_text(
            json.dumps(
                dict(device=device, rows=check.rows, skipped=check.skipped), indent=1
            )
        )
    return check


if __name__ == "__main__":
    sys.exit(1 if main().failures() else 0)
