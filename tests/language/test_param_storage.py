"""`(defparam ... :dtype :bf16)` stores a trainable parameter in bf16, as nn.Embedding(...).bfloat16()
does; `(concat [INIT ...])` and `(tensor [...])` give a parameter mixed initial values. Checked
against hand-written PyTorch: dtypes, values, state_dict loading, gradients, explain's bytes.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sx2torch import runtime as sx
from sx2torch.tools import explain

EMBEDDING = """
(defconst vocab 32)
(defconst d 16)
(defmodel embedding (&key (v 8) (d 4))
  (defparam weight (normal [v d]) :dtype :bf16)
  (defun forward (ids) (take weight ids)))
(defparam embed (embedding :v vocab :d d))
(defparam head (normal [d vocab] :std 0.02))
(defun forward (ids) (matmul (embed ids) head))
(defrun bf16 :precision :bf16)
(defrun f32 :precision :f32)
"""


class Reference(nn.Module):
    """The real simple GPT's embedding and an f32 head, written by hand."""

    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d).bfloat16()
        self.head = nn.Parameter(torch.randn(d, vocab) * 0.02)

    def forward(self, ids, precision, target):
        x = self.embed(ids)
        if precision == "f32":
            return x.float() @ self.head
        head = self.head.to(torch.bfloat16)
        if target == "cuda":
            return x @ head
        return (x.float() @ head.float()).to(torch.bfloat16).float()


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("precision", ["bf16", "f32"])
def test_a_bf16_parameter_computes_as_the_hand_written_embedding(
    build, precision, target
):
    module, code = build(EMBEDDING, "e.lisp", run=precision, target=target)
    assert "torch.normal(0.0, 1.0, size=(v, d)).to(torch.bfloat16)" in code
    torch.manual_seed(0)
    model, reference = module.E(), Reference()
    assert isinstance(model.embed.weight, nn.Parameter)
    assert model.embed.weight.dtype == torch.bfloat16
    assert model.head.dtype == torch.float32
    state = reference.state_dict()
    assert {k: v.dtype for k, v in model.state_dict().items()} == {
        k: v.dtype for k, v in state.items()
    }
    model.load_state_dict(state, strict=True)
    assert torch.equal(model.embed.weight, reference.embed.weight)
    ids = torch.randint(0, 32, (3, 5))
    got, want = model(ids), reference(ids, precision, target)
    assert got.dtype == (
        torch.bfloat16 if (precision, target) == ("bf16", "cuda") else torch.float32
    )
    assert torch.equal(got, want)


@pytest.mark.parametrize("precision", ["bf16", "f32"])
def test_training_steps_the_bf16_weight_with_a_bf16_gradient(build, precision):
    module, _ = build(EMBEDDING, "e.lisp", run=precision)
    torch.manual_seed(0)
    model, reference = module.E(), Reference()
    model.load_state_dict(reference.state_dict(), strict=True)
    before = model.embed.weight.detach().clone()
    ids = torch.tensor([[1, 4, 4, 7]])
    model(ids).float().square().sum().backward()
    reference(ids, precision, "cuda").float().square().sum().backward()
    grad = model.embed.weight.grad
    assert grad.dtype == torch.bfloat16
    assert torch.equal(grad, reference.embed.weight.grad)
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    after = model.embed.weight
    assert after.dtype == torch.bfloat16
    changed = (after != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [1, 4, 7]


def test_explicit_f32_and_frozen_bf16_storage(build):
    source = (
        "(defparam a (normal [4 4]) :dtype :f32)\n"
        "(defparam f (normal [4]) :trainable false :dtype :bf16)\n"
        "(defparam g (normal [4]) :trainable false :dtype :f32)\n"
        "(defun forward (x) (+ (matmul x a) f g))\n"
        "(defrun train :precision :bf16)\n"
    )
    module, code = build(source)
    model = module.Model()
    assert model.a.dtype == torch.float32 and isinstance(model.a, nn.Parameter)
    # g is read only in bf16, which would store it bf16 without its :dtype :f32
    assert {k: v.dtype for k, v in model.named_buffers()} == {
        "f": torch.bfloat16,
        "g": torch.float32,
    }
    assert 'register_buffer("g", torch.normal(0.0, 1.0, size=(4,)))' in code


def test_explain_counts_two_bytes_an_element():
    rows = {row["name"]: row for row in explain.run(EMBEDDING, "e.lisp")["params"]}
    assert rows["embed.weight"]["dtype"] == "bf16"
    assert rows["embed.weight"]["bytes"] == 32 * 16 * 2
    assert rows["head"]["bytes"] == 16 * 32 * 4


MIXED = """
(defconst n-layer 3)
(defconst pad 2)
(defparam scalars
  (concat [(full [n-layer] 1.05) (tensor [0.5 1]) (zeros [1]) (full [1] 0.5)
           (full [3] -1.5) (concat [(ones [pad]) (normal [2] :std 0)])]))
(defparam pair (tensor [0.5 -2]))
(defun forward (x) (* x (sum scalars) (sum pair)))
"""


def mixed_reference(n_layer=3, pad=2):
    return torch.cat(
        [
            1.05 * torch.ones(n_layer),
            torch.tensor([0.5, 1.0]),
            torch.zeros(1),
            0.5 * torch.ones(1),
            -1.5 * torch.ones(3),
            torch.ones(pad),
            torch.zeros(2),
        ]
    )


def test_concat_values_equal_torch_cat_of_the_parts(build):
    module, code = build(MIXED)
    assert "torch.full((n_layer,), 1.05)" in code
    assert "torch.tensor([0.5, -2.0])" in code
    model = module.Model()
    assert torch.equal(model.scalars.data, mixed_reference())
    assert model.scalars.dtype == torch.float32
    assert torch.equal(model.pair.data, torch.tensor([0.5, -2.0]))
    wider = module.Model(n_layer=5, pad=4)
    assert torch.equal(wider.scalars.data, mixed_reference(5, 4))


def test_concat_size_in_explain_uses_the_consts():
    rows = {row["name"]: row for row in explain.run(MIXED, "m.lisp")["params"]}
    assert rows["scalars"]["shape"] == [3 + 2 + 1 + 1 + 3 + 2 + 2]
    assert rows["scalars"]["bytes"] == 14 * 4
    assert rows["pair"]["shape"] == [2]
    wider = explain.run(MIXED.replace("pad 2", "pad 10"), "m.lisp")["params"]
    assert wider[0]["shape"] == [22] and wider[0]["bytes"] == 22 * 4


def test_a_bf16_concat_is_rounded_once_after_the_cat(build):
    module, code = build(
        "(defparam s (concat [(full [2] 1.05) (tensor [0.3])]) :dtype :bf16)\n"
        "(defun forward (x) (* x s))\n"
    )
    assert "torch.cat([torch.full((2,), 1.05), torch.tensor([0.3])]).to(" in code
    want = torch.tensor([1.05, 1.05, 0.3]).to(torch.bfloat16)
    assert torch.equal(module.Model().s.data, want)
    assert torch.equal(sx.round_to_bf16(torch.tensor([1.05, 1.05, 0.3])), want.float())
