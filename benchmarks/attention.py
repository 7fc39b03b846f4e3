"""causal-attention: the explicit composition against fused SDPA, values and speed.

The composition is the code sx2torch generates for ``(causal-attention q k v)``
(bf16 matmuls and 1/sqrt(d) under ``:bf16``, the mask and softmax in f32); the
fused form is ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` on
the same operands (bf16 ones under ``:bf16``). For each shape and precision
it prints the largest absolute difference of each from a float64 reference
computed from the operands as both read them (so under ``:bf16`` it measures
the arithmetic, not the rounding of the inputs), and the median time of a
forward and of a forward+backward, with the ratio composition / fused (above
1: the fused kernel is faster).

Run: ``python -m benchmarks.attention [--device cuda] [--repeat 20]``.
"""

import argparse
import math
import statistics
import time
import types

import torch
import torch.nn.functional as F

from sx2torch.compiler import Options, compile_source

SOURCE = """
(require sexpgpu/nn)
(defun forward (q k v)
  (let ((q (cast q :PRECISION))
        (k (cast k :PRECISION))
        (v (cast v :PRECISION)))
    (causal-attention q k v)))
(defrun run :precision :PRECISION)
"""
SHAPES = [
    (8, 4, 128, 32),
    (4, 8, 512, 64),
    (1, 8, 1024, 64),
]  # batch, heads, time, head dim
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def composition(precision: str) -> torch.nn.Module:
    """The module sx2torch generates for one causal-attention under ``precision``."""
    code = compile_source(
        SOURCE.replace("PRECISION", precision), "attention.lisp", Options(target="cuda")
    )
    module = types.ModuleType("attention")
    exec(compile(code, "<attention>", "exec"), module.__dict__)
    return module.Attention()


def fused(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    return F.scaled_dot_product_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True
    )


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    above = torch.ones(
        q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device
    ).triu(1)
    return torch.softmax(scores.masked_fill(above, -math.inf), dim=-1) @ v


def median_seconds(step, repeat: int, device: torch.device) -> float:
    def timed() -> float:
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for _ in range(3):
        timed()
    return statistics.median(timed() for _ in range(repeat))


def forward_backward(attend, q, k, v):
    def step():
        q.grad = k.grad = v.grad = None
        attend(q, k, v).float().square().sum().backward()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    device = torch.device(args.device)
    print(
        f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    header = f"{'shape':>18} {'prec':>4} | {'max |err| ours':>14} {'fused':>9} | {'fwd ms ours':>11} {'fused':>7} {'ratio':>5} | {'fwd+bwd ms ours':>15} {'fused':>7} {'ratio':>5}"
    print(header)
    print("-" * len(header))
    for shape in SHAPES:
        torch.manual_seed(0)
        q, k, v = (
            torch.randn(*shape, device=device, requires_grad=True) for _ in range(3)
        )
        for precision, dtype in DTYPES.items():
            # both forms read the operands rounded to the run's dtype: measure from there
            exact = reference(*(x.detach().to(dtype) for x in (q, k, v)))
            ours = composition(precision).to(device)
            with torch.no_grad():
                ours_error = (ours(q, k, v).double() - exact).abs().max().item()
                fused_error = (
                    (fused(q, k, v, dtype).double() - exact).abs().max().item()
                )

                def ours_fwd():
                    ours(q, k, v)

                def fused_fwd():
                    fused(q, k, v, dtype)

                fwd = [
                    median_seconds(s, args.repeat, device) * 1e3
                    for s in (ours_fwd, fused_fwd)
                ]
            bwd = [
                median_seconds(forward_backward(f, q, k, v), args.repeat, device) * 1e3
                for f in (ours, lambda q, k, v: fused(q, k, v, dtype))
            ]
            print(
                f"{str(shape):>18} {precision:>4} | {ours_error:>14.2e} {fused_error:>9.2e} | "
                f"{fwd[0]:>11.2f} {fwd[1]:>7.2f} {fwd[0] / fwd[1]:>5.2f} | "
                f"{bwd[0]:>15.2f} {bwd[1]:>7.2f} {bwd[0] / bwd[1]:>5.2f}"
            )


if __name__ == "__main__":
    main()
