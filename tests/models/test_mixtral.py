"""examples/mixtral.lisp is Hugging Face transformers' MixtralForCausalLM with sparse top-2
routing: its state_dict loads with strict=True (the experts' 3-D weights as transformers 5
stores them) and the logits are transformers' own, under both runs.

transformers runs its experts with `experts_implementation="eager"`, the loop its modeling
file writes (the one sx.sparse_experts follows); its default, "grouped_mm", is a different
kernel, compared here within a tolerance.
"""

from __future__ import annotations

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from cases import MIXTRAL, lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source

SIZES = MIXTRAL


def mixtral(run: str):
    path = lisp("mixtral")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    return load_module(code).Mixtral


def transformers_model(dtype, experts: str = "eager"):
    torch.manual_seed(0)
    config = MixtralConfig(
        **SIZES, attn_implementation="sdpa", experts_implementation=experts
    )
    model = MixtralForCausalLM(config).eval()
    with torch.no_grad():  # transformers' init leaves the router's weights small
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    return model.to(dtype)


def ids(length: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (2, length), generator=torch.Generator().manual_seed(length)
    )


def u_norm(got: torch.Tensor, want: torch.Tensor) -> float:
    """The relative norm of the difference, in units of bf16's 2^-8."""
    diff = (got.float() - want.float()).norm() / want.float().norm()
    return float(diff / 2**-8)


@pytest.mark.parametrize("length", [16, 11])
def test_f32_logits_are_transformers(length):
    real = transformers_model(torch.float32)
    model = mixtral("exact")(**SIZES)
    model.load_state_dict(real.state_dict(), strict=True)
    with torch.no_grad():
        got, want = model(ids(length)), real(ids(length)).logits
    assert got.dtype == want.dtype == torch.float32 and got.shape == (2, length, 256)
    assert (got - want).abs().max() <= 1e-4


@pytest.mark.parametrize("length", [16, 11])
def test_bf16_logits_are_transformers_bit_for_bit(length):
    real = transformers_model(torch.bfloat16)
    model = mixtral("train")(**SIZES)
    model.load_state_dict(real.state_dict(), strict=True)
    with torch.no_grad():
        got, want = model(ids(length)), real(ids(length)).logits
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want), u_norm(got, want)


def test_against_transformers_default_grouped_kernel():
    real = transformers_model(torch.bfloat16, experts="grouped_mm")
    model = mixtral("train")(**SIZES)
    model.load_state_dict(real.state_dict(), strict=True)
    with torch.no_grad():
        got, want = model(ids(16)), real(ids(16)).logits
    assert u_norm(got, want) <= 0.25


def test_it_trains_through_the_sparse_experts():
    real = transformers_model(torch.float32)
    model = mixtral("exact")(**SIZES)
    model.load_state_dict(real.state_dict(), strict=True)
    x, targets = ids(12), ids(12).roll(1, dims=1)
    model.loss(x, targets).backward()
    real_loss = torch.nn.functional.cross_entropy(
        real(x).logits.reshape(-1, 256), targets.reshape(-1)
    )
    real_loss.backward()
    ours = dict(model.named_parameters())
    for name, p in real.named_parameters():
        assert ours[name].grad is not None, name
        torch.testing.assert_close(ours[name].grad, p.grad, rtol=1e-4, atol=1e-5)


EXPERTS = """
(defun forward (x ids w gu dn)
  (sparse-experts (cast x :bf16) ids w (cast gu :bf16) (cast dn :bf16)))
(defrun train :precision :bf16)
"""


def experts_reference(x, ids, w, gu, dn):
    """sparse-experts under :bf16 in plain PyTorch bf16 ops: each linear, the SiLU and the
    product rounded, the weighted f32 result rounded, each addition rounded."""
    x, gu, dn = (t.to(torch.bfloat16) for t in (x, gu, dn))
    out = torch.zeros_like(x)
    for e in range(gu.shape[0]):
        rows, k = torch.where(ids == e)
        gate, up = torch.nn.functional.linear(x[rows], gu[e]).chunk(2, dim=-1)
        h = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, dn[e])
        out = out.index_add(0, rows, (h * w[rows, k, None]).to(torch.bfloat16))
    return out


def experts_inputs():
    """Exact by construction: x and gate-up are multiples of 1/8 below 4, so each gate and
    up is an exact f32 sum (about 15 bits) that bf16 must round; each row of down has one
    power of two, so the second linear is one exact product."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-32, 32, (6, 8), generator=g) / 8
    gu = torch.randint(-32, 32, (3, 4, 8), generator=g) / 8
    dn = torch.zeros(3, 8, 2)
    for e in range(3):
        for r in range(8):
            dn[e, r, (r + e) % 2] = 2.0 ** (r % 3 - 1) * (-1) ** r
    ids = torch.tensor([[0, 2], [2, 1], [0, 1], [2, 0], [1, 2], [1, 0]])
    w = torch.rand(6, 2, generator=g)
    return x, ids, w / w.sum(-1, keepdim=True), gu, dn


@pytest.mark.parametrize("target", ["cuda", "metal", "cpu"])
def test_the_sparse_experts_round_each_op_on_every_target(build, target):
    """The held targets (bf16 values in f32 tensors) round each op inside the layer as
    cuda's bf16 tensors do, not the f32 layer once (found-held-sparse-experts-rounding).
    """
    module, code = build(EXPERTS, target=target)
    assert ("held=True" in code) == (target != "cuda"), code
    got = module.Model()(*experts_inputs())
    want = experts_reference(*experts_inputs())
    assert got.dtype == (torch.bfloat16 if target == "cuda" else torch.float32)
    assert torch.equal(got.float(), want.float()), (got, want)
