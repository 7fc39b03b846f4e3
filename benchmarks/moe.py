"""Mixtral's sparse expert block: the step time (forward + backward) of the block
examples/mixtral.lisp compiles to (each token through its top-2 experts only), of the dense
formulation (every expert on every token, the router's weights zero where not chosen,
written with the routing ops), and of transformers' own MixtralSparseMoeBlock (its eager
expert loop), on the same weights and input, side by side, with the ratios.

The sparse block should cost about k/E of the dense one's expert time plus the dispatch,
and be within 1.1x of transformers'.

On a CPU it runs on one thread and counts the process's CPU time, which other jobs on a
shared machine do not inflate; on a GPU, wall time after a synchronize.

Run: ``python -m benchmarks.moe [--device cuda] [--tokens 1024] [--repeat 20]``.
"""

import argparse
import statistics
import time
import types
from pathlib import Path

import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

from sx2torch.compiler import Options, compile_source

ROOT = Path(__file__).resolve().parents[1]
DENSE = """
(defconst num-experts 8)
(defconst dim 256)
(defconst hidden 512)
(defconst top-k 2)
(defmodel router (&key (num-experts 8) (dim 256))
  (defparam weight (normal [num-experts dim] :std 0.02))
  (defun forward (x) (linear x weight)))
(defmodel experts (&key (num-experts 8) (dim 256) (hidden 512))
  (defparam gate-up-proj (normal [num-experts (* 2 hidden) dim] :std 0.02))
  (defparam down-proj (normal [num-experts dim hidden] :std 0.02))
  (defun forward (x routing)
    (let ((gate-up (matmul x (swap-axes gate-up-proj 1 2)))
          (gate (slice gate-up :axis -1 :end hidden))
          (up (slice gate-up :axis -1 :start hidden))
          (out (matmul (* (silu gate) up) (swap-axes down-proj 1 2))))
      (sum (* out (reshape (transpose routing [1 0]) [num-experts -1 1])) :axes [0]))))
(defparam gate (router :num-experts num-experts :dim dim))
(defparam experts (experts :num-experts num-experts :dim dim :hidden hidden))
(defun forward (x)
  (let ((flat (reshape x [-1 dim]))
        (probs (softmax (gate flat)))
        ([top chosen] (topk probs top-k))
        (routing (scatter-add (zeros-like probs) chosen
                              (/ top (sum top :axes [-1] :keepdims true)))))
    (reshape-as (experts flat routing) x)))
(defrun exact :precision :f32)
"""


def load(source: str, name: str, run: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(
        compile(compile_source(source, name, Options(run=run)), name, "exec"),
        vars(module),
    )
    return module


def step_time(block, x, repeat: int) -> float:
    """The median seconds of one forward and backward."""
    clock = time.perf_counter if x.is_cuda else time.process_time
    times = []
    for _ in range(repeat + 2):
        leaf = x.detach().requires_grad_()
        start = clock()
        block(leaf).sum().backward()
        if x.is_cuda:
            torch.cuda.synchronize()
        times.append(clock() - start)
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    sizes = dict(num_experts=8, dim=256, hidden=512, top_k=2)
    config = MixtralConfig(
        hidden_size=sizes["dim"],
        intermediate_size=sizes["hidden"],
        num_local_experts=sizes["num_experts"],
        num_experts_per_tok=sizes["top_k"],
        experts_implementation="eager",
    )
    torch.manual_seed(0)
    real = MixtralSparseMoeBlock(config)
    with torch.no_grad():
        for p in real.parameters():
            p.normal_(0.0, 0.05)
    mixtral = load((ROOT / "examples" / "mixtral.lisp").read_text(), "mixtral", "exact")
    sparse = mixtral.MixtralSparseMoeBlock(**sizes)
    dense = load(DENSE, "dense", "exact").Dense(**sizes)
    blocks = {"sparse (sx2torch)": sparse, "dense (sx2torch)": dense}
    for block in blocks.values():
        block.load_state_dict(real.state_dict(), strict=True)
    blocks["transformers"] = real
    x = torch.randn(
        1, args.tokens, sizes["dim"], generator=torch.Generator().manual_seed(1)
    )
    x = x.to(args.device)
    with torch.no_grad():
        want = real.to(args.device)(x)
        for name, block in blocks.items():
            got = block.to(args.device)(x)
            print(
                f"{name:20s} max abs from transformers: {(got - want).abs().max():.2e}"
            )
    times = {name: step_time(block, x, args.repeat) for name, block in blocks.items()}
    for name, seconds in times.items():
        print(f"{name:20s} {seconds * 1e3:8.2f} ms per step (forward + backward)")
    sparse_time = times["sparse (sx2torch)"]
    print(
        f"sparse / transformers: {sparse_time / times['transformers']:.2f} (goal <= 1.1)"
    )
    print(
        f"sparse / dense: {sparse_time / times['dense (sx2torch)']:.2f} "
        f"(k/E = {sizes['top_k'] / sizes['num_experts']:.2f}, plus the dispatch)"
    )


if __name__ == "__main__":
    main()
