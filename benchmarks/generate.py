"""Generation: tokens per second of sx2torch's cached decode against transformers' generate,
on the same Llama (examples/llama.lisp with transformers' weights) and the same prompt, side
by side in one run.

Four variants, all greedy over the same prompt:

- `sx2torch eager`: `sx2torch.runtime.generate(model, ids, N)`, its dynamic KV cache;
- `sx2torch compiled`: the same with `static_cache=True` (the decode step under
  `torch.compile(fullgraph=True)`, the cache preallocated);
- `transformers eager`: `model.generate(ids, do_sample=False, max_new_tokens=N)`;
- `transformers compiled`: the same with `cache_implementation="static"` and its
  `CompileConfig(fullgraph=True)`, compiled on the CPU too.

Every variant's tokens are checked equal to transformers' eager ones first, so that the
times are of the same work. A variant's first call (which compiles) is not timed; each call
after it is, interleaved with the others', and the median is taken. On a CPU it runs on one
thread and counts the process's CPU time, which other jobs on a shared machine do not
inflate; on a GPU, wall time after a synchronize. Tokens per second are of the whole call
(the prompt's forward included), the ratios each variant's against transformers' compiled
one and against its own eager one.

Run: ``python -m benchmarks.generate [--precision f32|bf16] [--new-tokens 64]
[--device cuda] [--no-compile]``; ``--ci`` is the suite's size (a tiny model, 4 tokens, 1
repetition).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import types
from pathlib import Path

import torch

from sx2torch.compiler import Options, compile_source
from sx2torch.runtime.generate import generate

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = {"f32": torch.float32, "bf16": torch.bfloat16}
SIZES = {  # LlamaConfig's names: a small model, and the suite's
    "default": dict(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
    ),
    "ci": dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}


def models(precision: str, sizes: dict, device: str) -> tuple:
    """(transformers' LlamaForCausalLM with random weights, as from_pretrained(dtype=...)
    gives it, and examples/llama.lisp's cached module holding the same weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # saving and loading the weights: not measured
    torch.manual_seed(0)
    config = LlamaConfig(**sizes, attn_implementation="sdpa")
    with tempfile.TemporaryDirectory() as folder:  # bf16 weights, the rotary buffer f32
        LlamaForCausalLM(config).save_pretrained(folder)
        theirs = LlamaForCausalLM.from_pretrained(folder, dtype=PRECISIONS[precision])
    source = (ROOT / "examples" / "llama.lisp").read_text(encoding="utf-8")
    source += f"\n(defrun benchmark :precision :{precision} :generate true)\n"
    code = compile_source(source, "llama.lisp", Options(run="benchmark"))
    module = types.ModuleType("llama")
    exec(compile(code, "<llama>", "exec"), module.__dict__)
    ours = module.Llama(**sizes)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    # no end token: every variant makes all the tokens asked for (min_new_tokens would
    # add a processor that changes transformers' scores)
    theirs.generation_config.eos_token_id = None
    return theirs.to(device).eval(), ours.to(device).eval()


def variants(theirs, ours, new_tokens: int, compiled: bool) -> dict:
    """{name: a call that generates `new_tokens` greedy tokens from a prompt}."""
    from transformers import CompileConfig

    # CUDA graphs on a GPU (transformers' default there), as sx2torch's static decode
    mode = "reduce-overhead" if theirs.device.type == "cuda" else "default"
    compile_config = CompileConfig(fullgraph=True, mode=mode)
    # transformers compiles its static generate on accelerators only, unless this is set
    compile_config._compile_all_devices = True
    static = dict(cache_implementation="static", compile_config=compile_config)
    runs = {
        "sx2torch eager": lambda ids: generate(ours, ids, new_tokens),
        "transformers eager": lambda ids: _transformers(theirs, ids, new_tokens),
    }
    if compiled:
        runs["sx2torch compiled"] = lambda ids: generate(
            ours, ids, new_tokens, static_cache=True
        )
        runs["transformers compiled"] = lambda ids: _transformers(
            theirs, ids, new_tokens, **static
        )
    return runs


def _transformers(model, ids, new_tokens: int, **options):
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            **options,
        )


def measure(runs: dict, ids: torch.Tensor, repeat: int) -> dict:
    """{name: the median time of a call}: each variant called once untimed (and checked
    against transformers' eager tokens), then `repeat` rounds in rotated orders."""
    expected = runs["transformers eager"](ids)
    for name, run in runs.items():
        tokens = run(ids)
        if not torch.equal(tokens, expected):
            raise SystemExit(
                f"{name} made other tokens than transformers' eager generate"
            )
    cuda = ids.is_cuda
    clock = time.perf_counter if cuda else time.process_time
    times: dict = {name: [] for name in runs}
    names = list(runs)
    for rep in range(repeat):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            if cuda:
                torch.cuda.synchronize()
            start = clock()
            runs[name](ids)
            if cuda:
                torch.cuda.synchronize()
            times[name].append(clock() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def report(medians: dict, tokens: int) -> list:
    """A line per variant: tokens per second, and its ratios to transformers' compiled
    generate and to its own eager one (above 1: faster)."""
    lines = []
    for name, seconds in medians.items():
        rate = tokens / seconds
        line = f"{name:22} {rate:10.1f} tok/s"
        if "transformers compiled" in medians:
            line += f"   x{medians['transformers compiled'] / seconds:5.2f} transformers compiled"
        eager = name.split()[0] + " eager"
        if name != eager:
            line += f"   x{medians[eager] / seconds:5.2f} own eager"
        lines.append(line)
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=PRECISIONS, default="f32")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=16, help="the prompt's length")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--ci", action="store_true", help="the suite's size")
    args = parser.parse_args(argv)
    sizes = SIZES["ci" if args.ci else "default"]
    if args.ci:
        args.new_tokens, args.prompt, args.repeat = 4, 5, 1
    if args.device == "cpu":
        torch.set_num_threads(1)
    theirs, ours = models(args.precision, sizes, args.device)
    ids = torch.randint(
        0,
        sizes["vocab_size"],
        (args.batch, args.prompt),
        generator=torch.Generator().manual_seed(0),
    ).to(args.device)
    runs = variants(theirs, ours, args.new_tokens, compiled=not args.no_compile)
    medians = measure(runs, ids, args.repeat)
    print(
        f"Llama {sizes}, {args.precision}, batch {args.batch}, prompt {args.prompt}, "
        f"{args.new_tokens} new tokens, {args.device}, median of {args.repeat}:"
    )
    for line in report(medians, args.batch * args.new_tokens):
        print(line)


if __name__ == "__main__":
    main()
