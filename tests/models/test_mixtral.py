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

from cases import lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source

SIZES = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
)


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
