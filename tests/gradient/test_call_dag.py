"""A call DAG under `gradient` is traced once per distinct call, not once per path."""

from __future__ import annotations

import torch

from conftest import load_module
from sx2torch import compiler
from sx2torch.compiler import Options, Unit, compile_source
from sx2torch.ir import walk


def call_dag(depth: int) -> str:
    """f_k calls f_{k-1} twice: 2^depth paths through `depth` defuns."""
    lines = ["(defparam w (normal [4]))", "(defun f0 (x) (* (sin x) w))"]
    lines += [f"(defun f{k} (x) (+ (f{k-1} x) (f{k-1} x)))" for k in range(1, depth)]
    lines.append(f"(defun forward (x) (gradient (sum (f{depth - 1} x)) x))")
    return "\n".join(lines) + "\n"


def nodes_after_gradient(depth: int) -> int:
    text = call_dag(depth)
    unit = compiler.run(Unit(text, "dag.lisp", Options()), until="gradient")
    return sum(len(list(walk(graph.nodes))) for graph in unit.graphs.values())


def test_a_deep_call_dag_compiles_and_differentiates_like_autograd():
    # each defun more adds the same nodes: its calls are traced once, not once per path
    # (2^12 paths at depth 12)
    per_defun = nodes_after_gradient(3) - nodes_after_gradient(2)
    assert nodes_after_gradient(12) == nodes_after_gradient(2) + 10 * per_defun
    depth = 30  # 2^30 paths: inlining each would never finish
    code = compile_source(call_dag(depth), "dag.lisp")
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
