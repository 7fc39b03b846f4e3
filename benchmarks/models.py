"""The ports against transformers: examples/llama.lisp, gpt2.lisp and mixtral.lisp, compiled
with their `exact` (f32) defrun, against the transformers classes they port, built from
configs with random weights and loaded into the port with ``strict=True``; side by side on
the same ids: forward (no grad), forward + backward (the sum of the logits), the number
of ops in the forward graph ``torch.compile`` traces, and with ``--compiled`` the first
compiled forward and backward (inductor compiling) and the compiled step after it.

The op count is what dynamo hands its backend: the calls in the traced forward. Per
block, it is the count of a two-layer model less a one-layer one's, so that what the
embedding and the head add is not counted in; the calls one block makes that the other's
does not are listed by what they call (`square` where transformers calls `pow`, say).

Each first compiled step runs in a fresh process of its own, with an empty inductor cache
and its FX graph and AOTAutograd caches off, after a small function has set inductor up,
the two sides alternating which goes first, ``--cold`` times each. In one process, the
second model compiles from the first one's C++ kernels, which inductor keeps by their
source: the Llama port's first step took 0.54x transformers' compiled after it, 1.33x
before it.

On one thread, counting the process's CPU time (and its children's: the C++ compiler's);
variants interleaved, medians.
Goals (issue 39): eager forward and forward + backward within 1.05x of transformers, the
first compiled step within 1.1x, no op per block that transformers' graph does not have.

Run: ``python -m benchmarks.models [--model NAME] [--length 128] [--repeat 10] [--compiled]
[--cold 3]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch._inductor.config

from sx2torch.compiler import Options, compile_source

ROOT = Path(__file__).resolve().parents[1]

# name -> (transformers config and model classes, the port's class, the config's sizes)
MODELS = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        "Llama",
        dict(
            vocab_size=1024,
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=4,
        ),
    ),
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        "Gpt2",
        dict(vocab_size=1024, n_positions=512, n_embd=256, n_layer=2, n_head=8),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        "Mixtral",
        dict(
            vocab_size=1024,
            hidden_size=256,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=4,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
    ),
}
WHO = ["sx2torch", "transformers"]
LAYERS = {
    "llama": "num_hidden_layers",
    "gpt2": "n_layer",
    "mixtral": "num_hidden_layers",
}


def pair(name: str, layers: int | None = None) -> tuple[dict, int]:
    """The logits of the port and of transformers' model, whose weights the port loads,
    both in eval mode, as functions of the ids; and the vocabulary's size."""
    import transformers

    config_class, model_class, port_class, sizes = MODELS[name]
    if layers is not None:
        sizes = dict(sizes, **{LAYERS[name]: layers})
    options = dict(attn_implementation="sdpa")
    if name == "mixtral":
        options["experts_implementation"] = "eager"
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**sizes, **options)
    real = getattr(transformers, model_class)(config).eval()
    path = ROOT / "examples" / f"{name}.lisp"
    code = compile_source(path.read_text(), path.name, Options(run="exact"))
    module = types.ModuleType(name)
    exec(compile(code, path.name, "exec"), vars(module))
    port = getattr(module, port_class)(**sizes).eval()
    port.load_state_dict(real.state_dict(), strict=True)
    logits = {"sx2torch": port, "transformers": lambda ids: real(ids).logits}
    return logits, sizes["vocab_size"]


def timed(fn, backward: bool) -> float:
    """CPU seconds of one call, the process's and its finished children's: inductor's
    first step runs the C++ compiler in subprocesses."""
    start = cpu_time()
    if backward:
        fn().sum().backward()
    else:
        with torch.no_grad():
            fn()
    return cpu_time() - start


def cpu_time() -> float:
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in map(
            resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        )
    )


def medians(runs: dict, backward: bool, repeat: int) -> dict:
    times = {name: [] for name in runs}
    for rep in range(repeat + 1):
        names = list(runs)
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            elapsed = timed(runs[name], backward)
            if rep:  # the first round warms up
                times[name].append(elapsed)
    return {name: statistics.median(t) for name, t in times.items()}


def graph_ops(logits, ids) -> collections.Counter:
    """The calls in the forward graph dynamo traces (one graph: a break is an error), by
    what each calls."""
    counted: collections.Counter = collections.Counter()

    def count(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            if node.op == "call_module":
                counted[type(graph_module.get_submodule(node.target)).__name__] += 1
            elif node.op in ("call_function", "call_method"):
                counted[getattr(node.target, "__name__", str(node.target))] += 1
        return graph_module.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(logits, backend=count, fullgraph=True)(ids)
    return counted


def compare(name: str, length: int, repeat: int, compiled: bool, cold: int) -> None:
    logits, vocab = pair(name)
    ids = ids_of(vocab, length)
    with torch.no_grad():
        diff = (logits["sx2torch"](ids) - logits["transformers"](ids)).abs().max()
    print(f"{name}: length {length}, max abs logit difference {diff:.1e}")
    runs = {who: (lambda f: lambda: f(ids))(f) for who, f in logits.items()}
    for backward in (False, True):
        got = medians(runs, backward, repeat)
        label = "forward + backward" if backward else "forward"
        print(
            f"  {label}: sx2torch {got['sx2torch'] * 1e3:.1f} ms, transformers "
            f"{got['transformers'] * 1e3:.1f} ms, ratio "
            f"{got['sx2torch'] / got['transformers']:.3f} (goal <= 1.05)"
        )
    if name == "mixtral":  # each expert's tokens are a data-dependent count
        print("  forward graph ops: none, the expert loops break the graph")
    else:
        op_counts(name, ids)
    if compiled:
        first_compiled_step(name, length, cold)
        warm_compiled_step(runs, logits, ids, repeat)


def ids_of(vocab: int, length: int) -> torch.Tensor:
    return torch.randint(
        0, vocab, (1, length), generator=torch.Generator().manual_seed(1)
    )


def op_counts(name: str, ids) -> None:
    """The ops of a block (two layers' graph less one layer's), each side's, and the
    calls each block makes that the other's does not."""
    ops = {}
    for layers in (1, 2):
        one, _ = pair(name, layers)
        ops[layers] = {
            who: graph_ops(one[who], ids) for who in ("sx2torch", "transformers")
        }
    block = {who: ops[2][who] - ops[1][who] for who in ("sx2torch", "transformers")}
    port, real = block["sx2torch"], block["transformers"]
    print(
        f"  forward graph ops, two layers: sx2torch {ops[2]['sx2torch'].total()}, "
        f"transformers {ops[2]['transformers'].total()}; per block: sx2torch "
        f"{port.total()}, transformers {real.total()}"
    )
    for who, more in (("sx2torch", port - real), ("transformers", real - port)):
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(more.items()))
        print(f"    only {who}'s block makes: {listed or 'nothing'}")


def first_compiled_step(name: str, length: int, repeat: int) -> None:
    """The first compiled step (forward and backward, inductor compiling) of each side,
    each in a fresh process of its own, the two interleaved, `repeat` times."""
    first: dict = {who: [] for who in WHO}
    for rep in range(repeat):
        for who in WHO[rep % 2 :] + WHO[: rep % 2]:
            first[who].append(first_step_in_child(name, length, who))
    port, real = (statistics.median(first[who]) for who in WHO)
    listed = {who: ", ".join(f"{t:.1f}" for t in first[who]) for who in WHO}
    print(
        f"  compiled, first forward + backward (median of {repeat}, each in a fresh "
        f"process): sx2torch {port:.1f} s ({listed['sx2torch']}), transformers "
        f"{real:.1f} s ({listed['transformers']}), ratio {port / real:.2f} (goal <= 1.1)"
    )


def first_step_in_child(name: str, length: int, who: str) -> float:
    """CPU seconds of `who`'s first compiled step in a process of its own, with an empty
    inductor cache and inductor's FX graph and AOTAutograd caches off: what a first
    compile costs, whichever side compiled before it."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(
            os.environ,
            TORCHINDUCTOR_CACHE_DIR=cache,
            TORCHINDUCTOR_FX_GRAPH_CACHE="0",
            TORCHINDUCTOR_AUTOGRAD_CACHE="0",
        )
        command = [sys.executable, "-m", "benchmarks.models", "--model", name]
        command += ["--length", str(length), "--first-step", who]
        out = subprocess.run(
            command, env=env, check=True, capture_output=True, text=True, cwd=ROOT
        )
    return float(out.stdout.split()[-1])


def first_step(name: str, length: int, who: str) -> None:
    """`--first-step`, in the child: set inductor up with a small function (the same
    for both sides), then print the CPU seconds of `who`'s first compiled step."""
    logits, vocab = pair(name)
    ids = ids_of(vocab, length)
    warm = torch.randn(4, requires_grad=True)
    torch.compile(lambda x: x.sin() + 1)(warm).sum().backward()
    torch._dynamo.reset()
    fn = torch.compile(logits[who])
    print(timed(lambda: fn(ids), backward=True))


def warm_compiled_step(runs: dict, logits: dict, ids, repeat: int) -> None:
    """The compiled step after the first, side by side in this process."""
    torch._dynamo.reset()
    for who, forward in logits.items():
        runs[who] = (lambda f: lambda: f(ids))(torch.compile(forward))
    got = medians(runs, True, repeat)  # its warm-up round compiles
    print(
        f"  compiled, forward + backward after the first: sx2torch "
        f"{got['sx2torch'] * 1e3:.1f} ms, transformers {got['transformers'] * 1e3:.1f} "
        f"ms, ratio {got['sx2torch'] / got['transformers']:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, action="append")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument(
        "--cold", type=int, default=3, help="first compiled steps timed, each side"
    )
    parser.add_argument("--first-step", choices=WHO, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    # inductor compiles in this process (and the compilers it starts), where the CPU time
    # counts it, not in a pool of workers that outlive the step
    torch._inductor.config.compile_threads = 1
    if args.first_step:
        first_step(args.model[0], args.length, args.first_step)
        return
    for name in args.model or MODELS:
        compare(name, args.length, args.repeat, args.compiled, args.cold)


if __name__ == "__main__":
    main()
