"""Time a tiny-gpt training step on CPU: the generated module against a hand-written GPT.

``ReferenceGpt`` below is tiny-gpt written by hand the way modded-nanogpt's simple
training track writes a GPT: f32 master weights cast at their use with
``.type_as(x)``, ``F.rms_norm`` without a gain, qk-norm, a relu² MLP,
``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, the lm head's logits
cast up with ``.float()`` before the softcap, cross-entropy in f32. Its parameters
have the generated ``TinyGpt``'s names and shapes, so either model's ``state_dict``
loads into the other. ``tests/models/test_reference_gpt.py`` compares the two numerically;
this script compares their speed.

Six variants are measured side by side in one process, their repetitions
interleaved (the order rotates every round): the generated module
(``examples/tiny-gpt.lisp``, ``--target cuda``: native bf16 tensors, which is what
the reference uses too), the reference, and ``seed-ref``, the reference with the
seed's three roundings switched on (its forward is the generated one bit for bit,
so it is the same math written by hand), each eager and ``torch.compile``d
(inductor, ``fullgraph=True``; the loss is compiled, AdamW's step stays eager).
One step is ``zero_grad``, ``loss(idx, targets).backward()``, ``AdamW.step()``;
the figure reported is the median over the repetitions. The goal: generated /
reference <= 1.05, eager and compiled; generated / seed-ref is the emitter's own
overhead. ``--profile`` adds the top ops of each eager step (torch.profiler) and
the ops where the generated step and seed-ref's differ most.

Run: ``python -m benchmarks.gpt [--reps 30] [--batch 8] [--time 128] [--threads N]
[--no-compile] [--profile]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import types
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.timing import Variant, measure, training_step
from sx2torch.compiler import Options, compile_source

__all__ = [
    "ReferenceBlock",
    "ReferenceGpt",
    "SEED_ROUNDINGS",
    "TINY_GPT",
    "load_tiny_gpt",
    "norm",
]

ROOT = Path(__file__).resolve().parent.parent
TINY_GPT = ROOT / "examples" / "tiny-gpt.lisp"
EPS = 1e-6  # tiny-gpt's rms-norm eps (F.rms_norm's default on bf16 is f32's 1.19e-7)
SEED_ROUNDINGS = {"seed_norm": True, "seed_attention": True, "seed_head": True}


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
            # default scale 1/sqrt(head_dim); the CPU flash kernel does not round
            # the scores to bf16 (tests/models/test_reference_gpt.py measures how close
            # to the f32 attention it is).
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

    All three on, the forward is the generated module's, op for op: the same
    bits on CPU (``tests/models/test_reference_gpt.py``).
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
    """Compile tiny-gpt (``examples/tiny-gpt.lisp`` by default) and import it from a file."""
    if source is None:
        source = TINY_GPT.read_text(encoding="utf-8")
    code = compile_source(source, TINY_GPT.name, Options(target=target))
    return import_generated(code, name)


def import_generated(code: str, name: str) -> types.ModuleType:
    """Import generated code from a file as module ``name``.

    A real file in ``sys.modules``: ``torch.compile`` looks the generated
    functions' globals up through it.
    """
    # a stable path, so that inductor's caches recognize the code from run to run
    path = Path(tempfile.gettempdir()) / "sx2torch-benchmarks" / f"{name}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(code, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_models(config: dict) -> dict[str, nn.Module]:
    """The generated TinyGpt, the reference and the reference with the seed's
    roundings (the generated forward, bit for bit), all with the same non-zero weights.
    """
    module = load_tiny_gpt()
    torch.manual_seed(0)
    generated = module.TinyGpt(**config)
    with torch.no_grad():
        for p in generated.parameters():
            if p.abs().max() == 0:  # w_o, w_down, lm_head start at zero
                p.normal_(0.0, p.shape[0] ** -0.5)
    models = {
        "generated": generated,
        "reference": ReferenceGpt(**config),
        "seed-ref": ReferenceGpt(**config, **SEED_ROUNDINGS),
    }
    for net in models.values():
        net.load_state_dict(generated.state_dict())
    return models


def variants(
    config: dict, inputs: tuple[torch.Tensor, ...], compiled: bool
) -> list[Variant]:
    made = [
        Variant(f"{label} eager", training_step(net, net.loss, inputs))
        for label, net in make_models(config).items()
    ]
    if compiled:
        # fresh models, so that no two variants' AdamW steps share weights
        for label, net in make_models(config).items():
            loss = torch.compile(net.loss, fullgraph=True)
            made.append(Variant(f"{label} compiled", training_step(net, loss, inputs)))
    return made


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
        if f"generated {mode}" not in median:
            continue
        ratio = median[f"generated {mode}"] / median[f"reference {mode}"]
        same_math = median[f"generated {mode}"] / median[f"seed-ref {mode}"]
        print(
            f"  generated / reference, {mode:8} = {ratio:5.3f}"
            f"   (goal <= {goal}: {'met' if ratio <= goal else 'MISSED'});"
            f" generated / seed-ref = {same_math:5.3f}"
        )
    return median


def profile(net: nn.Module, inputs: tuple[torch.Tensor, ...], reps: int) -> dict:
    """Self CPU time per step (ms) and calls per step of every event in an eager step."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    step = training_step(net, net.loss, inputs)
    for _ in range(3):
        step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            step()
    return {
        e.key: (e.self_cpu_time_total / reps / 1e3, e.count // reps)
        for e in prof.key_averages()
    }


def print_profiles(config: dict, inputs: tuple[torch.Tensor, ...], reps: int) -> None:
    """The top ops of each model's eager step, then the ops where generated and
    seed-ref (the same math) differ most."""
    events = {
        label: profile(net, inputs, reps) for label, net in make_models(config).items()
    }
    for label, table in events.items():
        total = sum(ms for ms, _ in table.values())
        print(f"    {label}: {total:.2f} ms/step of self CPU time under the profiler")
        ops = sorted(table.items(), key=lambda item: -item[1][0])
        for key, (ms, count) in ops[:10]:
            print(f"      {key[:52]:52} {ms:7.3f} ms/step  x{count}")
    ours, theirs = events["generated"], events["seed-ref"]
    print("    generated - seed-ref, by op (ms/step, calls/step):")
    keys = sorted(
        set(ours) | set(theirs),
        key=lambda k: -abs(ours.get(k, (0, 0))[0] - theirs.get(k, (0, 0))[0]),
    )
    for key in keys[:12]:
        (a, n), (b, m) = ours.get(key, (0.0, 0)), theirs.get(key, (0.0, 0))
        print(f"      {key[:52]:52} {a - b:+7.3f}   x{n} vs x{m}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--time", type=int, default=128)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

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
        print_profiles(config, inputs, reps=10)


if __name__ == "__main__":
    main()
