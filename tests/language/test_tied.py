"""Tied parameters and deep reads (issue 20, item 4): `(tie lm-head.weight
transformer.wte.weight)` makes one nn.Parameter under both state_dict keys, as transformers'
tie_weights leaves them, and `transformer.wte.weight` reads a parameter at any depth."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from cases import lisp
from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

KEYS = ["transformer.ln", "transformer.wte.weight", "lm_head.weight"]


@pytest.fixture
def model(build):
    module, code = build(lisp("tied-weights").read_text(), "tied-weights.lisp")
    assert "self.lm_head.weight = self.transformer.wte.weight" in code
    torch.manual_seed(0)
    return module.TiedWeights()


def test_one_parameter_under_both_keys(model):
    state = model.state_dict()
    assert list(state) == KEYS
    assert (
        state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()
    )
    assert model.lm_head.weight is model.transformer.wte.weight
    assert [name for name, _ in model.named_parameters()] == KEYS[:2]


def test_the_deep_read_and_the_tied_head_compute_as_plain_pytorch(model):
    ids = torch.randint(0, 10, (2, 5))
    w = model.transformer.wte.weight.to(torch.bfloat16)
    h = model.transformer.ln.to(torch.bfloat16) * w[ids]
    expected = F.linear(h, w) + F.linear(h, w)
    got = model(ids)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_one_optimizer_step_moves_both_keys_identically(model):
    before = model.state_dict()["lm_head.weight"].clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randint(0, 10, (2, 5))).float().square().sum().backward()
    optimizer.step()
    state = model.state_dict()
    assert not torch.equal(state["lm_head.weight"], before)
    assert torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])


def test_a_checkpoint_with_both_keys_loads_strictly(model):
    torch.manual_seed(1)
    weight = torch.randn(10, 4)
    state = {"transformer.ln": torch.ones(4), "transformer.wte.weight": weight}
    model.load_state_dict({**state, "lm_head.weight": weight}, strict=True)
    assert torch.equal(model.lm_head.weight, weight)
    assert model.lm_head.weight is model.transformer.wte.weight


SOURCE = """(defmodel head (&key (n 3))
  (defparam weight (normal [n n]))
  (defparam frozen (ones [n]) :trainable false)
  (defparam low (ones [n]) :dtype :bf16)
  (defun forward (x) (* frozen (* low (linear x weight)))))
(defparam a (head))
(defparam b (head))
(defparam w (normal [3 3]))
"""


@pytest.mark.parametrize(
    ("tie", "col", "message"),
    [
        ("(tie a.wieght b.weight)", 6, "'a.wieght' names no parameter"),
        ("(tie a.frozen b.frozen)", 6, "'a.frozen' cannot be tied: a tie joins"),
        ("(tie a.low w)", 12, "'a.low' cannot be tied to 'w': it must be another"),
        ("(tie w w)", 8, "'w' cannot be tied to 'w'"),
        ("(tie a.weight w) (tie w b.weight)", 23, "'w' is tied already, at line 9"),
        ("(tie a.weight w) (tie a.weight b.weight)", 23, "'a.weight' is tied already"),
        ("(tie a.weight)", 1, "wrong number of arguments: expected (tie NAME TARGET)"),
    ],
)
def test_a_tie_that_cannot_hold_is_a_located_diagnostic(tie, col, message):
    source = SOURCE + tie + "\n(defun forward (x) (a x))\n"
    with pytest.raises(SourceError) as raised:
        compile_source(source, "model.lisp", Options())
    assert raised.value.span.line == 9
    assert raised.value.span.col == col
    assert raised.value.message.startswith(message), raised.value.message


def test_two_parameters_tied_to_one_are_one(build):
    module, code = build(
        SOURCE + "(tie a.weight w) (tie b.weight w)\n" "(defun forward (x) (b (a x)))\n"
    )
    model = module.Model()
    assert model.a.weight is model.w and model.b.weight is model.w
    x = torch.randn(2, 3)
    expected = F.linear(F.linear(x, model.w) * model.a.low.float(), model.w)
    torch.testing.assert_close(model(x), expected * model.b.low.float(), rtol=0, atol=0)


def test_the_interpreter_ties_and_reads_deep_as_the_module_does(model):
    source = lisp("tied-weights").read_text()
    interpreted = interpret.load(
        source, "tied-weights.lisp", run="train", state=model.state_dict()
    )
    ids = torch.randint(0, 10, (2, 5))
    assert torch.equal(interpreted("forward", ids), model(ids))
    tensors = interpreted.tensors()
    assert tensors["lm_head.weight"] is tensors["transformer.wte.weight"]
