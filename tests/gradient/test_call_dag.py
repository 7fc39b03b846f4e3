"""A call DAG under `gradient` is traced once per distinct call, not once per path."""

from __future__ import annotations

import time

import torch

from conftest import load_module
from sx2torch.compiler import compile_source


def call_dag(depth: int) -> str:
    """f_k calls f_{k-1} twice: 2^depth paths through `depth` defuns."""
    lines = ["(defparam w (normal [4]))", "(defun f0 (x) (* (sin x) w))"]
    lines += [f"(defun f{k} (x) (+ (f{k-1} x) (f{k-1} x)))" for k in range(1, depth)]
    lines.append(f"(defun forward (x) (gradient (sum (f{depth - 1} x)) x))")
    return "\n".join(lines) + "\n"


def test_a_deep_call_dag_compiles_and_differentiates_like_autograd():
    depth = 30  # 2^30 paths: inlining each would never finish
    started = time.perf_counter()
    code = compile_source(call_dag(depth), "dag.lisp")
    assert time.perf_counter() - started < 20
    model = load_module(code).Dag()
    x = torch.randn(3, 4, dtype=torch.float32)
    reference = x.clone().requires_grad_()
    torch.sum(torch.sin(reference) * model.w.detach() * 2.0 ** (depth - 1)).backward()
    torch.testing.assert_close(model(x), reference.grad, rtol=1e-6, atol=0.0)


def test_calls_with_other_inputs_are_traced_apart(build):
    source = """
(defparam w (normal [4]))
(defun f (x) (* (sin x) w))
(defun forward (x) (gradient (sum (+ (f x) (f (* x 2.0)))) x))
"""
    module, _ = build(source)
    model = module.Model()
    x = torch.randn(3, 4)
    reference = x.clone().requires_grad_()
    w = model.w.detach()
    torch.sum(torch.sin(reference) * w + torch.sin(reference * 2.0) * w).backward()
    torch.testing.assert_close(model(x), reference.grad)
