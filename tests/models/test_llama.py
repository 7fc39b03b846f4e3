"""examples/llama.lisp is Hugging Face transformers' LlamaForCausalLM: its state_dict loads
with strict=True and the logits are transformers' own, bit for bit, under both runs.

transformers runs with attn_implementation="sdpa", its default: with no padding mask it calls
F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=head_dim ** -0.5,
enable_gqa=True), the call the example's `(attention ... :causal true :enable-gqa true)` makes.
"eager" attention rounds Q Kᵀ, its scaling and the softmax to bf16, a different computation.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cases import LLAMA, lisp
from conftest import adamw_losses, load_module
from sx2torch import cli
from sx2torch.compiler import Options, compile_source

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
SIZES = LLAMA


def llama(run: str):
    path = lisp("llama")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    return load_module(code).Llama


@pytest.fixture(scope="module")
def hf():
    """transformers, imported by the tests that use it: every xdist worker collects this
    file, and importing Llama's modeling code takes each one seconds."""
    import transformers

    return transformers


@pytest.fixture(scope="module")
def real(tmp_path_factory, hf):
    """transformers' model with random weights in f32, and as from_pretrained(...,
    dtype=torch.bfloat16) loads it: bf16 parameters, the rotary inv_freq buffer f32."""
    torch.manual_seed(0)
    config = hf.LlamaConfig(**SIZES, attn_implementation="sdpa")
    f32 = hf.LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("llama")
    f32.save_pretrained(folder)
    bf16 = hf.LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    assert bf16.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert bf16.model.rotary_emb.inv_freq.dtype == torch.float32
    return {"exact": f32, "train": bf16}


@pytest.mark.parametrize("length", [16, 11])
@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_real_checkpoint_loads_and_gives_the_real_logits(real, run, length):
    model = llama(run)(**SIZES)
    model.load_state_dict(real[run].state_dict(), strict=True)
    ids = torch.randint(
        0, 256, (2, length), generator=torch.Generator().manual_seed(length)
    )
    with torch.no_grad():
        got, want = model(ids), real[run](ids).logits
    assert (
        got.dtype == want.dtype == (torch.float32 if run == "exact" else torch.bfloat16)
    )
    assert got.shape == (2, length, 256)
    assert torch.equal(got, want)


def test_the_constructor_takes_llama_configs_names(hf):
    """head_dim, rms_norm_eps and rope_theta reach the layers as they reach transformers'."""
    options = dict(SIZES, head_dim=32, rms_norm_eps=1e-5, rope_theta=500000.0)
    torch.manual_seed(3)
    real = hf.LlamaForCausalLM(
        hf.LlamaConfig(**options, attn_implementation="sdpa")
    ).eval()
    model = llama("exact")(**options)
    model.load_state_dict(real.state_dict(), strict=True)
    assert model.model.layers[1].self_attn.q_proj.weight.shape == (128, 64)
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), real(ids).logits)


def test_it_trains():
    torch.manual_seed(1)
    model = llama("train")(**SIZES)
    ids = torch.randint(0, 256, (4, 32))
    targets = torch.roll(ids, -1, dims=1)
    losses = adamw_losses(model, ids, targets, steps=8)
    assert losses[-1] < 0.8 * losses[0]


def test_it_compiles_as_one_graph():
    torch.manual_seed(2)
    model = llama("train")(**SIZES)
    ids = torch.randint(0, 256, (2, 16))
    # fullgraph: a graph break is an error, so this is the one graph
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(ids), model(ids))


def test_the_source_is_at_most_73_lines_of_code():
    lines = lisp("llama").read_text().splitlines()
    code = [
        line for line in lines if line.strip() and not line.lstrip().startswith(";")
    ]
    assert len(code) <= 73


def test_the_guides_loading_snippet_runs(tmp_path, hf, monkeypatch):
    """The guide's snippet, on a small random checkpoint with Llama's vocabulary size: its
    command line (the CLI's main) and its program, run in this process in the folder it
    writes `llama.py` to (the test checks what they do, not a Python start)."""
    section = GUIDE.split("\n### Llama\n", 1)[1].split("\n### ", 1)[0]
    (command,) = re.findall(r"^```sh\n(.*?)\n```$", section, flags=re.M | re.S)
    (snippet,) = re.findall(r"^```python\n(.*?)^```$", section, flags=re.M | re.S)
    torch.manual_seed(4)
    config = hf.LlamaConfig(**dict(SIZES, vocab_size=32000))
    hf.LlamaForCausalLM(config).save_pretrained(tmp_path / "checkpoint")
    name, source, *rest = shlex.split(command)
    assert name == "sx2torch"
    monkeypatch.chdir(tmp_path)
    assert cli.main([str(ROOT / source), *rest]) == 0
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "llama", raising=False)  # put back after the test
    try:
        exec(snippet, {"CHECKPOINT": str(tmp_path / "checkpoint")})
    finally:
        sys.modules.pop("llama", None)  # the snippet's module


def test_the_kernels_default_scale_is_transformers_head_dim_to_the_minus_half():
    """The example leaves :scale to the kernel, 1/sqrt(D) (compile-time arithmetic has no
    power); transformers passes head_dim ** -0.5. The doubles differ for some D (128), but the
    kernels use the scale in f32, or its square root in f32 (the math path), where they agree.
    """
    for d in range(1, 1025):
        theirs, ours = d**-0.5, 1 / math.sqrt(d)
        assert np.float32(theirs) == np.float32(ours)
        assert np.float32(math.sqrt(theirs)) == np.float32(math.sqrt(ours))
