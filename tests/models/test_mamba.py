"""examples/mamba.lisp is Hugging Face transformers' MambaForCausalLM, the slow path: its
state_dict loads with strict=True, no key renamed, and under :f32 the logits are
transformers' within 1e-5 at two lengths (the causal convolution trims to its input's length,
a run-time size, so one module serves every length)."""

from __future__ import annotations

import pytest
import torch

from cases import MAMBA, lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source

SIZES = MAMBA


def mamba(run: str):
    path = lisp("mamba")
    return load_module(
        compile_source(path.read_text(), path.name, Options(run=run))
    ).Mamba


@pytest.fixture(scope="module")
def real():
    """transformers' model with random weights, in f32 (imported here: every xdist worker
    collects this file)."""
    import transformers

    torch.manual_seed(0)
    return transformers.MambaForCausalLM(transformers.MambaConfig(**SIZES)).eval()


@pytest.mark.parametrize("length", [16, 7])
def test_the_real_checkpoint_loads_and_gives_the_real_logits(real, length):
    model = mamba("exact")(**SIZES)
    assert sorted(model.state_dict()) == sorted(real.state_dict())
    assert model.lm_head.weight is model.backbone.embeddings.weight
    model.load_state_dict(real.state_dict(), strict=True)
    ids = torch.randint(
        0, 256, (2, length), generator=torch.Generator().manual_seed(length)
    )
    with torch.no_grad():
        got, want = model(ids), real(ids).logits
    assert got.dtype == want.dtype == torch.float32 and got.shape == (2, length, 256)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_the_constructor_takes_mamba_configs_names(real):
    """intermediate_size is expand * hidden_size, time_step_rank ceil(hidden_size / 16)
    unless given, as MambaConfig computes them."""
    import transformers

    options = dict(SIZES, expand=3, conv_kernel=2, use_conv_bias=False)
    del options["time_step_rank"]
    torch.manual_seed(3)
    hf = transformers.MambaForCausalLM(transformers.MambaConfig(**options)).eval()
    model = mamba("exact")(**options)
    model.load_state_dict(hf.state_dict(), strict=True)
    mixer = model.backbone.layers[1].mixer
    assert mixer.conv1d.weight.shape == (192, 1, 2) and mixer.dt_proj.weight.shape == (
        192,
        4,
    )
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-5)


def test_a_fresh_model_has_transformers_a_log_and_d():
    """A_log is log(1..state_size) on every row, D ones: the S4D initialization."""
    model = mamba("exact")(**SIZES)
    mixer = model.backbone.layers[0].mixer
    want = torch.log(torch.arange(1, 9, dtype=torch.float32)).expand(128, 8)
    assert torch.equal(mixer.A_log.detach(), want)
    assert torch.equal(mixer.D.detach(), torch.ones(128))


@pytest.mark.parametrize("length", [16, 7])
def test_the_bf16_run_gives_transformers_bf16_logits_bit_for_bit(real, length):
    """As from_pretrained(..., dtype=torch.bfloat16) loads it: the bf16 weights into the f32
    masters. The residual stream is f32 (residual_in_fp32), each block reading it in bf16;
    the discretization, the skip and the gate, and norm_f's product are f32 islands, where
    transformers' code promotes to f32."""
    bf16 = type(real)(real.config).eval()
    bf16.load_state_dict(real.state_dict())
    bf16 = bf16.to(torch.bfloat16)
    model = mamba("train")(**SIZES)
    model.load_state_dict(bf16.state_dict(), strict=True)
    ids = torch.randint(
        0, 256, (2, length), generator=torch.Generator().manual_seed(length)
    )
    with torch.no_grad():
        got, want = model(ids), bf16(ids).logits
    # transformers' logits are its bf16 lm_head's, made f32 by .float()
    assert got.dtype == torch.bfloat16 and want.dtype == torch.float32
    assert torch.equal(got.float(), want)
