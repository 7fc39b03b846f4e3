"""Time a tiny-gpt training step on CPU: the generated module against a hand-written GPT.

``ReferenceGpt`` below is tiny-gpt written by hand the way modded-nanogpt's simple
training track writes a GPT: f32 master weights cast at their use with
``.type_as(x)``, ``F.rms_norm`` without a gain, qk-norm, a relu² MLP,
``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, the lm head's logits
cast up with ``.float()`` before the softcap, cross-entropy in f32. Its parameters
have the generated ``TinyGpt``'s names and shapes, so either model's ``state_dict``
loads into the other. ``tests/test_reference_gpt.py`` compares the two numerically;
this script compares their speed.

Four variants are measured side by side in one process, their repetitions
interleaved (the order rotates every round): the generated module
(``golden/tiny-gpt.lisp``, ``--target cuda``: native bf16 tensors, which is what
the reference uses too) and the reference, each eager and ``torch.compile``d
(inductor, ``fullgraph=True``; the loss is compiled, AdamW's step stays eager).
One step is ``zero_grad``, ``loss(idx, targets).backward()``, ``AdamW.step()``;
the figure reported is the median over the repetitions. The goal: generated /
reference <= 1.05, eager and compiled. ``--profile`` adds the top ops of each eager
step (torch.profiler) and an ablation of the generated step.

Run: ``python -m benchmarks.gpt [--reps 30] [--batch 8] [--time 128] [--no-compile]
[--profile]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from sx2torch.compiler import Options, compile_source

__all__ = ["ReferenceBlock", "ReferenceGpt", "load_tiny_gpt", "TINY_GPT"]

ROOT = Path(__file__).resolve().parent.parent
TINY_GPT = ROOT / "golden" / "tiny-gpt.lisp"
EPS = 1e-6  # tiny-gpt's rms-norm eps (F.rms_norm's default on bf16 is f32's 1.19e-7)


def norm(x: torch.Tensor, seed: bool = False) -> torch.Tensor:
    """rms-norm without a gain over the last axis.

    ``seed=False``: ``F.rms_norm``, which computes in f32 and rounds its result
    once. ``seed=True``: the seed's rule (sexpgpu/nn ``rms-norm``, only the mean of
    squares and the rsqrt are sensitive): the rsqrt is rounded to bf16 and the
    final multiply is a bf16 one, so the result is rounded twice.
    """
    if not seed:
        return F.rms_norm(x, (x.size(-1),), eps=EPS)
    x32 = x.float()
    return x * torch.rsqrt(x32.square().mean(-1, keepdim=True) + EPS).type_as(x)


class ReferenceBlock(nn.Module):
    """One tiny-gpt block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``.

    ``seed_norm`` and ``seed_attention`` switch on the seed's roundings (see
    ``ReferenceGpt``); both off, this is the modded-nanogpt way of writing it.
    """

    def __init__(
        self,
        d: int = 128,
        n_head: int = 4,
        *,
        seed_norm: bool = False,
        seed_attention: bool = False,
    ):
        super().__init__()
        self.n_head = n_head
        self.seed_norm = seed_norm
        self.seed_attention = seed_attention
        self.w_qkv = nn.Parameter(torch.normal(0.0, 0.02, size=(d, 3 * d)))
        self.w_o = nn.Parameter(torch.zeros(d, d))
        self.w_up = nn.Parameter(torch.normal(0.0, 0.02, size=(d, 4 * d)))
        self.w_down = nn.Parameter(torch.zeros(4 * d, d))

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        batch, time_steps, d = x.shape
        qkv = x @ self.w_qkv.type_as(x)
        q, k, v = (
            qkv.view(batch, time_steps, 3 * self.n_head, d // self.n_head)
            .transpose(1, 2)
            .chunk(3, dim=1)
        )  # each [batch, head, time, head_dim]
        q, k = norm(q, self.seed_norm), norm(k, self.seed_norm)
        if self.seed_attention:
            # sexpgpu/nn causal-attention as the seed rounds it: the bf16 scores
            # (rounded by the product, and again by the 1/sqrt(head_dim) scale),
            # an f32 softmax island, its weights rounded to bf16 for the bf16 PV.
            scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
            above = torch.ones(
                time_steps, time_steps, dtype=torch.bool, device=x.device
            ).triu(1)
            weights = torch.softmax(scores.float().masked_fill(above, -torch.inf), -1)
            y = weights.type_as(v) @ v
        else:
            # default scale 1/sqrt(head_dim); the CPU flash kernel keeps the scores
            # and the softmax statistics in f32 (no bf16 scores) and rounds y once.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(batch, time_steps, d)
        return y @ self.w_o.type_as(y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(norm(x, self.seed_norm))
        hidden = F.relu(norm(x, self.seed_norm) @ self.w_up.type_as(x)).square()
        return x + hidden @ self.w_down.type_as(x)


class ReferenceGpt(nn.Module):
    """tiny-gpt by hand, modded-nanogpt style; the generated ``TinyGpt``'s state_dict.

    The three switches reproduce the seed's rounding points, which the
    modded-nanogpt way of writing does not have:

    - ``seed_norm``: rms-norm rounds its rsqrt to bf16 before a bf16 multiply;
      ``F.rms_norm`` rounds only its result.
    - ``seed_attention``: the explicit composition, bf16 scores rounded (twice:
      the product, then the 1/sqrt(head_dim) scale) before the f32 softmax,
      weights rounded to bf16 for a bf16 PV product;
      ``F.scaled_dot_product_attention`` (CPU flash kernel) does not round the
      scores.
    - ``seed_head``: the lm head's f32-out product (``(matmul x lm-head :out
      :f32)``: the f32 accumulator of the bf16 operands, here an f32 GEMM of the
      bf16 values, which is what ``sx.matmul_f32_out`` computes on CPU); the
      modded-nanogpt head is a bf16 GEMM rounded to bf16, then ``.float()``.

    All three on, the forward is the generated module's, op for op.
    """

    def __init__(
        self,
        *,
        vocab: int = 512,
        d: int = 128,
        n_head: int = 4,
        n_layer: int = 2,
        seed_norm: bool = False,
        seed_attention: bool = False,
        seed_head: bool = False,
    ):
        super().__init__()
        self.vocab = vocab
        self.seed_norm = seed_norm
        self.seed_head = seed_head
        self.wte = nn.Parameter(torch.normal(0.0, 1.0, size=(vocab, d)))
        self.blocks = nn.ModuleList(
            ReferenceBlock(
                d, n_head, seed_norm=seed_norm, seed_attention=seed_attention
            )
            for _ in range(n_layer)
        )
        self.lm_head = nn.Parameter(torch.zeros(d, vocab))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = norm(F.embedding(idx, self.wte).bfloat16(), self.seed_norm)
        for block in self.blocks:
            x = block(x)
        x = norm(x, self.seed_norm)
        if self.seed_head:
            logits = x.float() @ self.lm_head.type_as(x).float()
        else:
            logits = (x @ self.lm_head.type_as(x)).float()
        return 15 * torch.tanh(logits / 15)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.forward(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def load_tiny_gpt(
    source: str | None = None, target: str = "cuda", name: str = "sx_tiny_gpt"
) -> types.ModuleType:
    """Compile tiny-gpt (``golden/tiny-gpt.lisp`` by default) and import it from a file.

    A real file in ``sys.modules``: ``torch.compile`` looks the generated
    functions' globals up through it.
    """
    if source is None:
        source = TINY_GPT.read_text(encoding="utf-8")
    code = compile_source(source, TINY_GPT.name, Options(target=target))
    path = Path(tempfile.mkdtemp(prefix="sx2torch-gpt-")) / f"{name}.py"
    path.write_text(code, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Variant:
    name: str
    step: Callable[[], None]
    times: list[float] = field(default_factory=list)
    first_s: float = 0.0  # the first step, which for a compiled variant compiles


def training_step(
    net: nn.Module, loss_of: Callable, inputs: tuple[torch.Tensor, ...]
) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_of(*inputs).backward()
        optimizer.step()

    return step


def make_models(config: dict) -> tuple[nn.Module, nn.Module]:
    """The generated TinyGpt and the reference, with the same (non-zero) weights."""
    module = load_tiny_gpt()
    torch.manual_seed(0)
    generated = module.TinyGpt(**config)
    with torch.no_grad():
        for name, p in generated.named_parameters():
            if p.abs().max() == 0:  # w_o, w_down, lm_head start at zero
                p.normal_(0.0, p.shape[0] ** -0.5)
    reference = ReferenceGpt(**config)
    reference.load_state_dict(generated.state_dict())
    return generated, reference


def variants(
    config: dict, inputs: tuple[torch.Tensor, ...], compiled: bool
) -> list[Variant]:
    generated, reference = make_models(config)
    made = [
        Variant("generated eager", training_step(generated, generated.loss, inputs)),
        Variant("reference eager", training_step(reference, reference.loss, inputs)),
    ]
    if compiled:
        for label, net in (("generated", generated), ("reference", reference)):
            # a copy, so that the eager variant's AdamW and this one's don't share weights
            twin = type(net)(**config)
            twin.load_state_dict(net.state_dict())
            loss = torch.compile(twin.loss, fullgraph=True)
            made.append(Variant(f"{label} compiled", training_step(twin, loss, inputs)))
    return made


def measure(runs: list[Variant], reps: int, warmup: int) -> None:
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


def report(runs: list[Variant], goal: float = 1.05) -> dict[str, float]:
    median = {run.name: statistics.median(run.times) for run in runs}
    for run in runs:
        q1, _, q3 = statistics.quantiles(run.times, n=4)
        print(
            f"  {run.name:18} median {median[run.name] * 1e3:8.2f} ms"
            f"   (quartiles {q1 * 1e3:.2f} .. {q3 * 1e3:.2f} ms, n={len(run.times)};"
            f" first step {run.first_s:.2f} s)"
        )
    for mode in ("eager", "compiled"):
        if f"generated {mode}" in median:
            ratio = median[f"generated {mode}"] / median[f"reference {mode}"]
            verdict = "met" if ratio <= goal else "MISSED"
            print(
                f"  generated / reference, {mode:8} = {ratio:5.3f}"
                f"   (goal <= {goal}: {verdict})"
            )
    return median


def profile(net: nn.Module, inputs: tuple[torch.Tensor, ...], reps: int) -> None:
    """The top ops of an eager step by self CPU time, per step."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    step = training_step(net, net.loss, inputs)
    for _ in range(3):
        step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("step"):
            for _ in range(reps):
                step()
    events = {e.key: e for e in prof.key_averages()}
    total = events["step"].cpu_time_total / reps
    print(f"    {type(net).__name__}: {total / 1e3:.2f} ms/step under the profiler")
    ops = [e for key, e in events.items() if key.startswith("aten::")]
    for event in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:14]:
        print(
            f"      {event.key:40} {event.self_cpu_time_total / reps / 1e3:7.3f} ms/step"
            f"  x{event.count // reps}"
        )


def ablation(config: dict, inputs: tuple[torch.Tensor, ...], reps: int) -> None:
    """Reference variants with the seed's roundings switched on, one at a time.

    Each is the reference with one part written the way the generated module
    writes it, so its time against the plain reference is that part's cost.
    """
    _, reference = make_models(config)
    state = reference.state_dict()
    runs = []
    for label, switches in (
        ("reference", {}),
        ("+ seed norm", {"seed_norm": True}),
        ("+ seed attention", {"seed_attention": True}),
        ("+ seed head", {"seed_head": True}),
        (
            "all three",
            {"seed_norm": True, "seed_attention": True, "seed_head": True},
        ),
    ):
        net = ReferenceGpt(**config, **switches)
        net.load_state_dict(state)
        runs.append(Variant(label, training_step(net, net.loss, inputs)))
    measure(runs, reps, warmup=3)
    base = statistics.median(runs[0].times)
    for run in runs:
        med = statistics.median(run.times)
        print(
            f"    {run.name:18} {med * 1e3:8.2f} ms  ({(med - base) * 1e3:+.2f} ms,"
            f" x{med / base:.3f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--time", type=int, default=128)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    print(f"torch {torch.__version__}")
    print(f"CPU capability: {torch.backends.cpu.get_cpu_capability()}")
    print(f"threads: {torch.get_num_threads()}")
    config = {"vocab": 512, "d": 128, "n_head": 4, "n_layer": 2}  # tiny-gpt's own
    generator = torch.Generator().manual_seed(1)
    shape = (args.batch, args.time)
    idx = torch.randint(0, config["vocab"], shape, generator=generator)
    targets = torch.randint(0, config["vocab"], shape, generator=generator)
    inputs = (idx, targets)

    runs = variants(config, inputs, compiled=not args.no_compile)
    measure(runs, args.reps, args.warmup)
    print(
        f"\ntiny-gpt {config}, batch {args.batch} x {args.time} tokens,"
        f" one AdamW step (forward, backward, step)"
    )
    report(runs)
    if args.profile:
        print("\n  profiles (eager):")
        generated, reference = make_models(config)
        profile(generated, inputs, reps=10)
        profile(reference, inputs, reps=10)
        print("\n  ablation: the reference with the seed's roundings, eager")
        ablation(config, inputs, max(args.reps // 2, 10))


if __name__ == "__main__":
    main()
