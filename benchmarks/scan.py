"""Mamba's selective scan: the module sx2torch compiles from SexpGPU against transformers'
slow path (``mamba_selective_scan``, the loop ``MambaMixer.forward`` runs without the CUDA
kernels), side by side on the same inputs, forward and forward + backward.

The inputs have Mamba's shapes: ``A``, ``D`` and the time-step bias are a ``MambaMixer``'s
own, built from a ``MambaConfig`` (Mamba-130m's widths by default: hidden 768, inner 1536,
state 16); the activations are random. The compiled module runs ``linear-scan`` as the
runtime chooses (on a CPU with Mamba's widths, the loop); the third column runs the same
module with the log-depth parallel scan, which ``linear-scan`` always ran before, for the
before and after in one run. The goal: the compiled scan within 1.1x of transformers' loop.

``--model`` times instead the whole ``MambaForCausalLM`` forward: examples/mamba.lisp
compiled (its ``:f32`` run) against transformers' own on the same weights and ids
(``--layers`` blocks, vocabulary 1024, Mamba-130m's widths by default).

``--crossover`` prints instead the loop's time over the parallel scan's on ``[2, T, M]``
inputs: where it is below 1 the loop is faster, which is how the runtime's threshold
(``_OP_COST_IN_ELEMENTS`` in sx2torch/runtime/scan.py) was chosen.

On one thread, counting the process's CPU time, which other jobs on a shared machine do
not inflate; medians of interleaved rounds.

Run: ``python -m benchmarks.scan [--length 256] [--batch 1] [--hidden 768] [--repeat 10]``,
``python -m benchmarks.scan --model [--layers 2]`` or ``python -m benchmarks.scan --crossover``.
"""

import argparse
import statistics
import time
import types
from pathlib import Path
from unittest import mock

import torch
from transformers import MambaConfig, MambaForCausalLM
from transformers.models.mamba.modeling_mamba import MambaMixer, mamba_selective_scan

from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import scan

SOURCE = """
;; Mamba's selective scan, in the order transformers' mamba_selective_scan computes it.
(defun forward (u dt a b c d z dt-bias)
  "u, dt, z: [batch inner time]; a: [inner state]; b, c: [batch state time]; d, dt-bias: [inner]"
  (let ((delta (unsqueeze (softplus (+ dt (unsqueeze dt-bias :axis -1))) :axis -1))
        (decay (exp (* (unsqueeze a :axis 1) delta)))
        (input (* (* delta (unsqueeze (swap-axes b 1 2) :axis 1)) (unsqueeze u :axis -1)))
        (h (linear-scan decay input :axis 2))
        (y (sum (* h (unsqueeze (swap-axes c 1 2) :axis 1)) :axes [-1])))
    (* (+ y (* u (unsqueeze d :axis -1))) (silu z))))
(defrun exact :precision :f32)
"""


def compiled_scan():
    module = types.ModuleType("selective_scan")
    code = compile_source(SOURCE, "selective_scan.lisp", Options(run="exact"))
    exec(compile(code, "selective_scan.lisp", "exec"), vars(module))
    return module.SelectiveScan().forward


def transformers_scan(u, dt, a, b, c, d, z, dt_bias):
    return mamba_selective_scan(
        u, dt, a, b, c, D=d, z=z, delta_bias=dt_bias, delta_softplus=True
    )


def parallel(fn):
    """``fn`` with linear-scan's log-depth scan wherever the runtime would loop."""

    def run(*args):
        with mock.patch.object(scan, "_sequential", lambda b, dim: False):
            return fn(*args)

    return run


def inputs(batch: int, hidden: int, length: int):
    config = MambaConfig(hidden_size=hidden, num_hidden_layers=1)
    torch.manual_seed(0)
    mixer = MambaMixer(config, layer_idx=0)
    inner, state = mixer.intermediate_size, mixer.ssm_state_size
    activations = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=activations)

    with torch.no_grad():
        a = -torch.exp(mixer.A_log.float())
        return [
            randn(batch, inner, length),  # u: the convolved hidden states
            randn(batch, inner, length) - 2.0,  # dt before its bias and softplus
            a,
            randn(batch, state, length),
            randn(batch, state, length),
            mixer.D.float().clone(),
            randn(batch, inner, length),  # z: the gate
            mixer.dt_proj.bias.float().clone(),
        ]


def step_time(fn, args, backward: bool) -> float:
    start = time.process_time()
    if backward:
        leaves = [x.detach().requires_grad_() for x in args]
        fn(*leaves).sum().backward()
    else:
        with torch.no_grad():
            fn(*args)
    return time.process_time() - start


def compare(args, repeat: int) -> None:
    ours = compiled_scan()
    runs = {
        "transformers' loop": transformers_scan,
        "sx2torch": ours,
        "sx2torch, parallel scan": parallel(ours),
    }
    with torch.no_grad():
        want = transformers_scan(*args)
        for name, fn in runs.items():
            diff = (fn(*args) - want).abs().max().item()
            print(f"{name:24s} max abs from transformers: {diff:.2e}")
    for backward in (False, True):
        median = timed(runs, args, repeat, backward)
        base = median["transformers' loop"]
        label = "forward + backward" if backward else "forward"
        print(
            f"{label}: "
            + ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in median.items())
        )
        print(
            f"  sx2torch / transformers: {median['sx2torch'] / base:.2f} (goal <= 1.1); "
            f"parallel scan / transformers: {median['sx2torch, parallel scan'] / base:.2f}"
        )


def timed(runs: dict, args, repeat: int, backward: bool) -> dict:
    """Each run's median CPU time over `repeat` interleaved rounds, after one to warm up."""
    times = {name: [] for name in runs}
    for rep in range(repeat + 1):
        shift = rep % len(runs)
        for name in list(runs)[shift:] + list(runs)[:shift]:
            elapsed = step_time(runs[name], args, backward)
            if rep:
                times[name].append(elapsed)
    return {name: statistics.median(t) for name, t in times.items()}


def whole_model(batch: int, hidden: int, length: int, layers: int, repeat: int) -> None:
    """examples/mamba.lisp's forward against transformers' MambaForCausalLM's, same weights."""
    options = dict(vocab_size=1024, hidden_size=hidden, num_hidden_layers=layers)
    torch.manual_seed(0)
    real = MambaForCausalLM(MambaConfig(**options)).eval()
    source = Path(__file__).resolve().parents[1] / "examples" / "mamba.lisp"
    module = types.ModuleType("mamba")
    code = compile_source(source.read_text(), source.name, Options(run="exact"))
    exec(compile(code, source.name, "exec"), vars(module))
    ours = module.Mamba(**options).eval()
    ours.load_state_dict(real.state_dict(), strict=True)
    ids = [torch.randint(0, 1024, (batch, length), generator=torch.Generator())]
    runs = {"transformers": lambda i: real(i).logits, "sx2torch": ours}
    with torch.no_grad():
        diff = (ours(*ids) - real(*ids).logits).abs().max().item()
    print(
        f"MambaForCausalLM, {layers} layers, hidden {hidden}, batch {batch}, length "
        f"{length}; sx2torch's logits within {diff:.1e} of transformers'"
    )
    median = timed(runs, ids, repeat, backward=False)
    print(
        "forward: "
        + ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in median.items())
        + f"; sx2torch / transformers: {median['sx2torch'] / median['transformers']:.2f}"
    )


def crossover(repeat: int) -> None:
    """The loop's CPU time over the scan's on [2, T, M] inputs, scanned along T."""
    widths = (4, 32, 256, 1024, 4096)
    print("loop / parallel scan, [2, T, M]; columns: 2M elements a step")
    print("T      " + " ".join(f"{2 * m:>7d}" for m in widths))
    for length in (8, 64, 512, 2048):
        row = []
        for m in widths:
            a = torch.rand(2, length, m) * 0.5 + 0.5
            b = torch.randn(2, length, m)
            loop, tree = [], []
            for _ in range(repeat):
                start = time.process_time()
                scan._linear_loop(a, b, 1)
                loop.append(time.process_time() - start)
                start = time.process_time()
                parallel(scan.linear_scan)(a, b, 1)
                tree.append(time.process_time() - start)
            row.append(statistics.median(loop) / statistics.median(tree))
        print(f"{length:<6d} " + " ".join(f"{r:7.2f}" for r in row))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--crossover", action="store_true")
    parser.add_argument("--model", action="store_true")
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.model:
        whole_model(args.batch, args.hidden, args.length, args.layers, args.repeat)
        return
    if args.crossover:
        crossover(max(3, args.repeat // 2))
        return
    shapes = inputs(args.batch, args.hidden, args.length)
    print(
        f"batch {args.batch}, inner {shapes[0].shape[1]}, state {shapes[2].shape[1]}, "
        f"length {args.length}"
    )
    compare(shapes, args.repeat)


if __name__ == "__main__":
    main()
