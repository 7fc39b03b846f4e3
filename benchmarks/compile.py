"""Warm-cache ``torch.compile`` time of tiny-gpt: generated against hand-written, and
the held target (``--target cpu``) against ``--target cuda``.

Each figure is one training step's compile (``loss(idx, targets).backward()`` of
``torch.compile(net.loss, fullgraph=True)``) timed in a fresh process: a first process
fills a fresh inductor cache (the cold compile), a second one measures against it (the
warm compile, what every restart pays). The variants run side by side in one run: the
generated module for cuda (native bf16 tensors, run on the CPU), the same for the cpu
target, and ``ReferenceGpt`` (``benchmarks/gpt.py``), tiny-gpt written by hand. Goals:
warm generated / reference <= 1.5; cpu / cuda <= 1.5. The AOTAutograd cache counters of
each warm compile are printed: "hit" is the cache kept. The two generated variants are
measured again under ``emulate_precision_casts`` (a user's setting, under which the
runtime inlines its rounding as torch's cast, not as integer operations).

With ``--reps N`` the variants are measured N times, interleaved, and the ratios are
of the medians.

Run: ``python -m benchmarks.compile [--threads 1] [--reps 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

VARIANTS = (
    "generated",
    "generated-cpu",
    "reference",
    "generated emulate",
    "generated-cpu emulate",
)


def child(variant: str) -> None:
    """Compile and run one step in this process; print its time and cache counters."""
    from torch._dynamo.utils import counters

    from benchmarks.gpt import ReferenceGpt, load_tiny_gpt

    model, _, setting = variant.partition(" ")
    # the user's setting under which inductor keeps eager's bf16 round trips
    torch._inductor.config.emulate_precision_casts = setting == "emulate"
    if model == "reference":
        net = ReferenceGpt()
    else:
        target = "cpu" if model == "generated-cpu" else "cuda"
        net = load_tiny_gpt(target=target, name=f"sx_tiny_gpt_{target}").TinyGpt()
    generator = torch.Generator().manual_seed(0)
    idx, targets = torch.randint(0, 512, (2, 2, 32), generator=generator)
    start = time.perf_counter()
    torch.compile(net.loss, fullgraph=True)(idx, targets).backward()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "aot": dict(counters["aot_autograd"])}))


def run(variant: str, cache: str, threads: int) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.compile", "--child", variant],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    if args.child:
        torch.set_num_threads(args.threads)
        child(args.child)
        return
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for _ in range(args.reps):
        for variant in VARIANTS:
            with tempfile.TemporaryDirectory() as cache:
                cold = run(variant, cache, args.threads)
                warm = run(variant, cache, args.threads)
            results[variant].append((cold["seconds"], warm["seconds"]))
            print(
                f"{variant:22s} cold {cold['seconds']:6.2f} s  warm {warm['seconds']:6.2f} s"
                f"  warm AOTAutograd cache: {warm['aot']}",
                flush=True,
            )
    median = {
        variant: [statistics.median(times) for times in zip(*runs)]
        for variant, runs in results.items()
    }
    gen, ref = median["generated"], median["reference"]
    print(f"warm generated / reference: {gen[1] / ref[1]:.2f} (goal <= 1.5)")
    for setting in ("", " emulate"):
        cuda, held = median["generated" + setting], median["generated-cpu" + setting]
        print(
            f"cpu / cuda target{setting}: cold {held[0] / cuda[0]:.2f}, "
            f"warm {held[1] / cuda[1]:.2f} (goal <= 1.5)"
        )


if __name__ == "__main__":
    main()
