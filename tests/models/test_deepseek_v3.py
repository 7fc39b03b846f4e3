"""examples/deepseek-v3.lisp is Hugging Face transformers' DeepseekV3ForCausalLM: multi-head
latent attention with the interleaved rotary, a dense MLP on the first first_k_dense_replace
layers and the grouped top-k MoE with a shared expert on the others, one key `mlp` either
way (a choice of models, golden case layer-lists). Its state_dict loads with strict=True and
the logits are transformers' own: equal under :f32 and bit for bit under :bf16 against
from_pretrained(..., dtype=torch.bfloat16) (which keeps the router's weight and correction
bias in f32), at two lengths.

transformers runs its experts with `experts_implementation="eager"`, the loop its modeling
file writes, which sx.sparse_experts follows (as tests/models/test_mixtral.py does), and
attention with "sdpa".
"""

from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from cases import lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source

torch.set_num_threads(1)

SIZES = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    kv_lora_rank=16,
    q_lora_rank=24,
    qk_rope_head_dim=8,
    v_head_dim=12,
    qk_nope_head_dim=8,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=3,
    first_k_dense_replace=1,
)
IMPLEMENTATIONS = dict(attn_implementation="sdpa", experts_implementation="eager")


def deepseek(run: str):
    path = lisp("deepseek-v3")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    return load_module(code).DeepseekV3


def ids(length: int) -> torch.Tensor:
    return torch.randint(
        0, 128, (2, length), generator=torch.Generator().manual_seed(length)
    )


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """transformers' model with random weights (norms and the correction bias too, so the
    groups and experts chosen differ by token) in f32, and as from_pretrained loads it in
    bf16."""
    torch.manual_seed(0)
    config = DeepseekV3Config(num_key_value_heads=4, **SIZES, **IMPLEMENTATIONS)
    f32 = DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, value in f32.named_parameters():
            value.normal_(0.0, 1.0 if "norm" in name else 0.2)
        for name, value in f32.named_buffers():
            if "e_score_correction_bias" in name:
                value.normal_(0.0, 0.1)
    folder = tmp_path_factory.mktemp("deepseek-v3")
    f32.save_pretrained(folder)
    bf16 = DeepseekV3ForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, **IMPLEMENTATIONS
    ).eval()
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16
    return {"exact": f32, "train": bf16}


@pytest.mark.parametrize("length", [7, 12])
@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_real_checkpoint_loads_and_gives_the_real_logits(real, run, length):
    model = deepseek(run)(**SIZES)
    theirs = real[run].state_dict()
    assert set(model.state_dict()) == set(theirs)
    assert "model.layers.0.mlp.gate_proj.weight" in theirs  # the dense layer
    assert "model.layers.1.mlp.experts.gate_up_proj" in theirs  # the MoE's
    model.load_state_dict(theirs, strict=True)
    with torch.no_grad():
        got, want = model(ids(length)), real[run](ids(length)).logits
    dtype = torch.float32 if run == "exact" else torch.bfloat16
    assert got.dtype == want.dtype == dtype and got.shape == (2, length, 128)
    assert (got.float() - want.float()).abs().max() <= (1e-5 if run == "exact" else 0)
    assert torch.equal(got, want)


def test_each_layer_builds_the_model_its_index_chooses():
    model = deepseek("exact")(**dict(SIZES, first_k_dense_replace=2))
    kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
    assert kinds == ["DeepseekV3Mlp", "DeepseekV3Mlp", "DeepseekV3MoE"]
    path = lisp("deepseek-v3")
    code = compile_source(path.read_text(), path.name)
    assert "if layer_idx >= first_dense:\n            self.mlp = DeepseekV3MoE(" in code
    assert "return x + self.mlp(post_attention_layernorm)" in code


def test_the_source_is_at_most_151_lines_of_code():
    """transformers' DeepseekV3ForCausalLM (the RMS norm, rotary embedding, MLP, router,
    experts, MoE, attention with its rotary helpers, decoder layer, model and causal LM; the
    cache, masks and eager attention left out) is 435 lines of modeling_deepseek_v3.py
    without comments, docstrings and blank lines; the source's 151 include torch's
    nn.Linear and nn.Embedding, written as models of its own."""
    lines = lisp("deepseek-v3").read_text().splitlines()
    code = [
        line for line in lines if line.strip() and not line.lstrip().startswith(";")
    ]
    assert len(code) <= 151
