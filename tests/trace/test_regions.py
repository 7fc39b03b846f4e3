"""`if` and `for`: regions in the graph, checked against loops written in plain PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import load_module
from sx2torch import resolve, trace
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError
from sx2torch.ir import Kind, verify, walk
from sx2torch.ops import REGISTRY
from sx2torch.syntax.read import run as read

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def regions_reference(model, x0: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """golden/regions.lisp written by hand: the loop, its carried values and conditions."""
    x = backout = x0.to(dtype)
    gate = model.gate.to(dtype)
    for i, block in enumerate(model.blocks):
        scale = 1.0 if i < 2 else 0.5
        y = x + scale * torch.relu(x @ block.w.to(dtype))
        if model.gated and i == 1:
            y = y * gate
        x, backout = y, (y if i == model.backout_layer else backout)
    return x - backout


@pytest.mark.parametrize("run, dtype", [(None, torch.bfloat16)])
@pytest.mark.parametrize("backout_layer, gated", [(2, True), (0, False), (3, True)])
def test_the_regions_golden_case_is_the_hand_written_loop(
    run, dtype, backout_layer, gated
):
    source = (GOLDEN / "regions.lisp").read_text()
    module = load_module(compile_source(source, "regions.lisp", Options(run=run)))
    torch.manual_seed(0)
    model = module.Regions(backout_layer=backout_layer, gated=gated)
    with torch.no_grad():
        model.gate.copy_(torch.randn(8))
    x0 = torch.randn(2, 8)
    got = model(x0)
    assert got.dtype == dtype
    assert torch.equal(got, regions_reference(model, x0, dtype))


def test_a_stack_is_as_long_as_the_constructor_says(build):
    source = (
        (GOLDEN / "regions.lisp")
        .read_text()
        .replace("(defrun train :precision :bf16)", "")
    )
    module, _ = build(source)
    model = module.Model(n_layer=6, backout_layer=5)
    x0 = torch.randn(3, 8)
    assert len(model.blocks) == 6
    assert torch.equal(model(x0), regions_reference(model, x0, torch.float32))


def test_an_if_on_a_const_compiles_both_branches(build):
    source = """
(defconst use-relu true)
(defun forward (x) (if use-relu (relu x) (tanh x)))
"""
    module, code = build(source)
    x = torch.randn(5)
    assert torch.equal(module.Model()(x), torch.relu(x))
    assert torch.equal(module.Model(use_relu=False)(x), torch.tanh(x))
    assert "torch.relu(x) if self.use_relu else torch.tanh(x)" in code


def test_an_if_on_a_key_is_decided_by_the_caller(build):
    source = """
(defun pick (x &key (k 0)) (if (in k [1 2]) (* x 2.0) (if (not (> k 5)) x (- x))))
(defun forward (x) (pick x :k 6))
"""
    module, _ = build(source)
    x = torch.randn(4)
    model = module.Model()
    assert torch.equal(model(x), -x)
    assert torch.equal(model.pick(x, k=2), x * 2.0)
    assert torch.equal(model.pick(x), x)


def test_a_literal_condition_is_the_sources_own_choice(build):
    _, code = build("(defun forward (x) (if (< 1 2) (relu x) (tanh x)))")
    assert "return torch.relu(x)\n" in code and "tanh" not in code


def test_a_branch_with_statements_is_an_if_statement(build):
    source = """
(defconst deep true)
(defparam w (normal [4 4]))
(defun forward (x)
  (if deep
      (let ((h (relu (matmul x w))))
        (+ h (matmul h w)))
      x))
"""
    module, code = build(source)
    model = module.Model()
    x = torch.randn(3, 4)
    h = torch.relu(x @ model.w)
    assert torch.equal(model(x), h + h @ model.w)
    assert torch.equal(module.Model(deep=False)(x), x)
    assert "if self.deep:\n" in code and "else:\n" in code


def test_branches_of_different_dtypes_join_as_an_op_would():
    """Under :bf16 the f32 branch is cast down, as an op reading both would compute."""
    source = """
(defconst low true)
(defparam w (normal [4 4]))
(defun forward (x) (if low (matmul x w) (relu x)))
(defrun train :precision :bf16)
"""
    module = load_module(compile_source(source, "model.lisp"))
    x = torch.randn(3, 4)
    model = module.Model(low=False)
    assert model(x).dtype == torch.bfloat16
    assert torch.equal(model(x), torch.relu(x).to(torch.bfloat16))
    f32 = load_module(compile_source(source.replace(":bf16)", ":f32)"), "model.lisp"))
    assert f32.Model(low=True)(x).dtype == torch.float32


def test_chain_carries_the_joined_dtype_through_the_stack(build):
    """A layer that turns f32 into bf16: the loop carries bf16, its first input cast down."""
    source = """
(defmodel layer ()
  (defparam w (normal [4 4]))
  (defun forward (x) (matmul x w)))
(defparam layers (stack 3 (layer)))
(defun forward (x) (chain layers x))
(defrun train :precision :bf16)
"""
    module, code = build(source)
    model = module.Model()
    x = torch.randn(2, 4)
    expected = x.to(torch.bfloat16)
    for layer in model.layers:
        expected = expected @ layer.w.to(torch.bfloat16)
    assert torch.equal(model(x), expected)


def test_a_for_with_one_carried_value_and_no_index(build):
    source = """
(defmodel layer ()
  (defparam w (normal [4 4]))
  (defun forward (x y) (+ (matmul x w) y)))
(defparam layers (stack 3 (layer)))
(defun forward (x) (for (l layers) ((h x)) (l h x)))
"""
    module, code = build(source)
    model = module.Model()
    x = torch.randn(2, 4)
    h = x
    for layer in model.layers:
        h = h @ layer.w + x
    assert torch.equal(model(x), h)
    assert "for l in self.layers:" in code


@pytest.mark.parametrize(
    "body, message, at",
    [
        ("(for (i l layers) ((h x) (g x)) (l h))", "must end with a vector", "(l h))"),
        ("(for (i l w) ((h x)) (l h))", "is not a stack", "w)"),
        ("(for (i l layers) () (l h))", "expected the carried values", "()"),
        ("(for (i l layers) ((h 1.0)) (l h))", "must be a tensor", "1.0"),
        ("(if (sum x) x x)", "known when the module runs", "(sum x)"),
        (
            "(let (([a b] (relu x))) a)",
            "expected a for or a call giving 2 values",
            "(relu",
        ),
        ("(for (i l layers) ((h x) (g x)) [(l h) g])", "gives 2 values", "(for"),
        (
            "(let ((y (for (i l layers) ((h x)) (l h)))) (gradient (sum y) x))",
            "loop over 'layers' was traced outside the gradient form",
            "(l h)",
        ),
        ("(gradient (sum (nth layers 1 x)) x)", "(nth) is not supported yet", "(nth"),
        ("(and 1 true)", "takes conditions", "(and"),
        ("(l x)", "unknown op or function 'l'", "l x"),
    ],
)
def test_region_diagnostics(body, message, at):
    line = f"(defun forward (x) {body})"
    source = f"""(defmodel layer ()
  (defparam w (normal [4 4]))
  (defun forward (x) (matmul x w)))
(defparam layers (stack 2 (layer)))
(defparam w (normal [4]))
{line}
"""
    with pytest.raises(SourceError) as error:
        compile_source(source, "model.lisp")
    assert message in str(error.value)
    assert error.value.span.line == 6
    assert error.value.span.col == line.index(at) + 1


def test_traced_regions_verify_and_hold_their_nodes():
    program = resolve.run(read((GOLDEN / "regions.lisp").read_text()), "regions")
    graphs = trace.run(program)
    for graph in graphs.values():
        verify(graph, REGISTRY)
    forward = graphs["regions", "forward"]
    (loop,) = [n for n in forward.nodes if n.kind is Kind.FOR]
    (body,) = loop.regions
    assert [i.name for i in body.inputs] == ["x", "backout"]
    kinds = [n.kind for n in walk(body.nodes)]
    assert kinds.count(Kind.SUBMODEL) == 1 and Kind.IF in kinds
    assert [n.name for n in forward.nodes if n.kind is Kind.ITEM] == ["x", "backout"]


def test_verify_refuses_a_node_without_its_shape_or_with_an_undeclared_attribute():
    program = resolve.run(read("(defun forward (x) (relu (sum x :axes [0])))"), "m")
    graph = trace.run(program)["m", "forward"]
    verify(graph, REGISTRY)
    reduced, _ = graph.nodes
    assert reduced.shape.dims is None  # its rank unknown, as x's: but a shape, as made
    reduced.attrs = {**reduced.attrs, "size": 3}  # no argument or key of sum
    with pytest.raises(AssertionError, match="attributes"):
        verify(graph, REGISTRY)
    reduced.attrs.pop("size")
    reduced.shape = None
    with pytest.raises(AssertionError, match="made without its shape"):
        verify(graph, REGISTRY)


def test_a_loop_beside_the_path_of_a_gradient_calls_its_layers(build):
    """Y's loop does not depend on X: it is traced as it is, its layers called, not inlined
    (its value is the gradient: Y reads it only for the shape would leave it dead)."""
    source = """
(defmodel layer ()
  (defparam w (normal [4 4]))
  (defun forward (x) (matmul x w)))
(defparam layers (stack 2 (layer)))
(defparam v (normal [3 4]))
(defun forward (x)
  (gradient (+ (sum (* x x)) (sum (* x (for (l layers) ((h v)) (l h))))) x))
"""
    module, code = build(source)
    model = module.Model()
    x = torch.randn(3, 4)
    h = model.v.detach()
    for layer in model.layers:
        h = h @ layer.w.detach()
    assert torch.equal(model(x), h + x + x)  # the contributions in the order summed
    assert "for l in self.layers:" in code
