"""The training loop's overhead: sx2torch/runtime/train.py against a minimal hand-written loop.

Both train the generated tiny-gpt (``examples/tiny-gpt.lisp``, its ``train`` defrun: 8 x 64
tokens, Muon on the blocks' matrices and AdamW on the rest, gradient clipping at 1.0) on the
same token shard, from the same seed. The hand-written loop is what a user would write around
the module: slice the batch from a tensor, ``loss``, ``backward``, clip, the two optimizer
steps, ``zero_grad``, ``loss.item()``. The runtime loop adds the schedule, the shard reader,
the stop request, the progress bar and a line of ``metrics.jsonl`` per step. Per-step times
(from one step's end to the next, as the loop's own ``tokens_per_s`` measures them) are
collected over rounds that alternate the two loops; the first steps of each round are
warmup. The figure is the ratio of the medians; the goal is at most 1.05.

Run: ``python -m benchmarks.loop [--steps 40] [--rounds 4] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.gpt import load_tiny_gpt
from sx2torch.runtime import train
from sx2torch.runtime.data import write_shard

WARMUP = 5


def settings_of(path: str) -> dict:
    """The settings literal of a generated file's main block."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return ast.literal_eval(block.body[-1].value.args[1])


def runtime_round(model_class, settings, data: str, out: Path, steps: int) -> list:
    # the script's own parser, so the round has every flag's default as a user's run has it
    names = train.loss_arguments(model_class, settings["loss"])
    argv = ["--data", data, "--steps", str(steps), "--out", str(out)]
    args = train._arguments(settings, names, argv)
    with contextlib.redirect_stderr(io.StringIO()):  # the bar still draws, unseen
        assert train.train(model_class, settings, args) == 0
    rows = settings["batch_size"] * settings["seq_len"]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [rows / json.loads(line)["tokens_per_s"] for line in lines][WARMUP:]


def hand_round(model_class, settings, tokens: torch.Tensor, steps: int) -> list:
    torch.manual_seed(0)
    model = model_class()
    named = dict(model.named_parameters())
    matrices = [p for n, p in named.items() if n.startswith("blocks.")]
    rest = [named["wte"], named["lm_head"]]
    muon_settings, adamw_settings = settings["optimizers"]
    muon = torch.optim.Muon(
        matrices,
        lr=muon_settings["lr"],
        momentum=muon_settings["momentum"],
        weight_decay=0.0,
    )
    adamw = torch.optim.AdamW(
        rest,
        lr=adamw_settings["lr"],
        betas=adamw_settings["betas"],
        eps=1e-10,
        weight_decay=0.0,
    )
    batch, time_ = settings["batch_size"], settings["seq_len"]
    per_step = batch * time_
    times, last = [], time.perf_counter()
    for step in range(steps):
        chunk = tokens[step * per_step : (step + 1) * per_step + 1]
        loss = model.loss(chunk[:-1].view(batch, time_), chunk[1:].view(batch, time_))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings["grad_clip"])
        muon.step()
        adamw.step()
        muon.zero_grad(set_to_none=True)
        adamw.zero_grad(set_to_none=True)
        loss.item()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times[WARMUP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    module = load_tiny_gpt(name="sx_loop_tiny_gpt")
    settings = settings_of(module.__file__)
    per_step = settings["batch_size"] * settings["seq_len"]
    tokens = torch.randint(
        512, (args.steps * per_step + 1,), generator=torch.Generator().manual_seed(0)
    )
    runtime_times, hand_times = [], []
    with tempfile.TemporaryDirectory() as folder:
        shard = Path(folder) / "shard.bin"
        write_shard(shard, tokens)
        for round_ in range(args.rounds):
            order = ["runtime", "hand"] if round_ % 2 == 0 else ["hand", "runtime"]
            for which in order:
                if which == "runtime":
                    out = Path(folder) / f"run{round_}"
                    runtime_times += runtime_round(
                        module.TinyGpt, settings, str(shard), out, args.steps
                    )
                else:
                    hand_times += hand_round(
                        module.TinyGpt, settings, tokens, args.steps
                    )
    runtime_ms = 1000 * statistics.median(runtime_times)
    hand_ms = 1000 * statistics.median(hand_times)
    print(
        f"tiny-gpt, {settings['batch_size']} x {settings['seq_len']} tokens, {args.threads} thread(s), "
        f"{len(runtime_times)} steps each: runtime loop {runtime_ms:.1f} ms/step, "
        f"hand-written loop {hand_ms:.1f} ms/step, ratio {runtime_ms / hand_ms:.3f} (goal <= 1.05)"
    )


if __name__ == "__main__":
    main()
