"""The routing ops (topk, argmax, gather, index-select, scatter-add, index-add, cumsum)
against plain PyTorch: values and dtypes, their derivative rules, the interpreter."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from cases import lisp
from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

BF16 = torch.bfloat16
SOURCE = lisp("routing").read_text()


def reference(x, tokens, router, expert):
    """golden/routing.lisp under :bf16, in plain PyTorch."""
    logits = F.linear(x.to(BF16), router.to(BF16))
    probs = torch.softmax(logits.float(), dim=-1)
    top, chosen = torch.topk(probs, 2, dim=-1)
    weights = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x, dtype=BF16).index_add(
        0, tokens, x[tokens].to(BF16) @ expert.to(BF16)
    )
    return (
        torch.zeros_like(probs).scatter_add(-1, chosen, weights),
        chosen,
        torch.argmax(logits, dim=-1),
        torch.cumsum(weights, dim=-1),
        torch.gather(out, 1, chosen),
    )


def inputs():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(6, 4, generator=generator)
    return x, torch.tensor([5, 0, 2, 2, 1])


def test_the_golden_case_is_plain_pytorch_bit_for_bit(build):
    module, _ = build(SOURCE, "routing.lisp")
    torch.manual_seed(0)
    model = module.Routing()
    x, tokens = inputs()
    got = model(x, tokens)
    expected = reference(x, tokens, model.router, model.expert)
    assert [g.dtype for g in got] == [torch.float32, torch.int64, torch.int64] + [
        torch.float32,
        BF16,
    ]
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


def test_the_interpreter_agrees(build):
    module, _ = build(SOURCE, "routing.lisp")
    torch.manual_seed(1)
    model = module.Routing()
    oracle = interpret.load(SOURCE, "routing.lisp", state=model.state_dict())
    x, tokens = inputs()
    for ours, theirs in zip(model(x, tokens), oracle("forward", x, tokens)):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


def _gradient_of(build, body: str, x, *rest):
    names = " ".join(["x", *(f"a{i}" for i in range(len(rest)))])
    source = f"(defun forward ({names}) (gradient {body} x))\n"
    module, code = build(source)
    assert "autograd" not in code
    return module.Model()(x, *rest)


GRADIENTS = [
    (
        "(let (([v i] (topk x 2))) (sum (* v v)))",
        lambda x: torch.topk(x, 2).values.pow(2).sum(),
        (),
    ),
    (
        "(sum (* (cumsum x :axis 0) (cumsum x)))",
        lambda x: (x.cumsum(0) * x.cumsum(-1)).sum(),
        (),
    ),
    (
        "(sum (square (gather x a0)))",
        lambda x, i: torch.gather(x, -1, i).square().sum(),
        (torch.tensor([[0, 3], [1, 1], [2, 0]]),),
    ),
    (
        "(sum (square (index-select x a0)))",
        lambda x, i: x[i].square().sum(),
        (torch.tensor([2, 0, 2, 1]),),
    ),
    (
        "(sum (square (index-add (zeros-like a1) a0 x)))",
        lambda x, i, z: torch.zeros_like(z).index_add(0, i, x).square().sum(),
        (torch.tensor([1, 0, 1]), torch.zeros(2, 4)),
    ),
    (
        "(sum (square (scatter-add (zeros-like a1) a0 x)))",
        lambda x, i, z: torch.zeros_like(z).scatter_add(-1, i, x).square().sum(),
        (torch.tensor([[0, 0, 1, 5], [3, 1, 1, 1], [2, 2, 4, 4]]), torch.zeros(3, 6)),
    ),
]


@pytest.mark.parametrize(
    "body, function, rest", GRADIENTS, ids=[g[0] for g in GRADIENTS]
)
def test_each_derivative_rule_is_autograds(build, body, function, rest):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(5))
    leaf = x.clone().requires_grad_()
    expected = torch.autograd.grad(function(leaf, *rest), leaf)[0]
    torch.testing.assert_close(_gradient_of(build, body, x, *rest), expected)


def test_integer_results_have_no_gradient():
    source = "(defun forward (x) (gradient (sum (* x (argmax x))) x))\n"
    with pytest.raises(SourceError) as raised:
        compile_source(source, "model.lisp", Options())
    assert (raised.value.span.line, raised.value.span.col) == (1, 40)
    assert (
        "'argmax' has no gradient (integers carry no gradient)" in raised.value.message
    )


TOPK_BOTH = """
(defparam w (normal [4 8]))
(defun forward (x)
  (let ((probs (softmax (matmul x w)))
        ([top chosen] (topk probs 3)))
    [(/ top (sum top :axes [-1] :keepdims true)) chosen]))
(defrun train :precision :bf16)
"""


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_topk_values_are_topks_own_not_a_gather_at_its_indices(build, target):
    """One torch.topk gives the values and the indices (its values are the elements a
    gather at its indices reads: the same bits, the same gradient)."""
    module, code = build(TOPK_BOTH, target=target)
    assert "top, chosen = torch.topk(probs, 3, dim=-1)" in code
    assert "gather" not in code
    if target != "cuda":
        return
    torch.manual_seed(0)
    model = module.Model()
    x = torch.randn(5, 4, requires_grad=True)
    weights, chosen = model(x)
    ref = x.detach().clone().requires_grad_(True)
    probs = torch.softmax((ref.to(BF16) @ model.w.to(BF16)).float(), dim=-1)
    top, expected = torch.topk(probs, 3, dim=-1)
    assert torch.equal(chosen, expected)
    assert torch.equal(weights, top / top.sum(dim=-1, keepdim=True))
    (weights * torch.arange(15.0).reshape(5, 3)).sum().backward()
    (
        top / top.sum(dim=-1, keepdim=True) * torch.arange(15.0).reshape(5, 3)
    ).sum().backward()
    assert torch.equal(x.grad, ref.grad)


def test_topk_values_alone_are_written_as_its_values(build):
    module, code = build("""
(defun forward (x)
  (let (([top _] (topk x 2)))
    (* top 2.0)))
(defrun train :precision :f32)
""")
    assert "torch.topk(x, 2, dim=-1).values" in code
    assert "gather" not in code
    x = torch.randn(3, 5, requires_grad=True)
    out = module.Model()(x)
    ref = x.detach().clone().requires_grad_(True)
    expected = torch.topk(ref, 2, dim=-1).values * 2.0
    assert torch.equal(out, expected)
    out.sum().backward()
    expected.sum().backward()
    assert torch.equal(x.grad, ref.grad)
