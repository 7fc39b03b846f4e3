"""Mamba generates with its recurrent state cached (issue 36): examples/mamba.lisp's `generate`
run (bf16) and an f32 one added here, against transformers' MambaForCausalLM (a tiny config,
random weights, its slow path: no mamba_ssm or causal_conv1d kernels on a CPU).

The cache keeps each layer's causal convolution's last K - 1 inputs and its scan's last SSM
state, each in the dtype the op reads it in: the convolution's input bf16 under :bf16, the scan
f32 (the library's island). What holds, measured on these sizes (16 steps):

- f32: transformers' cached `generate`, tokens and every step's logits bit for bit (its decode
  step is F.conv1d over the same window and the same h * a + b), where the prompt is long
  enough that the runtime scans it with the plain loop, as transformers does (12 tokens here;
  on 7 its log-depth scan gives the state within 5e-7). Against re-running the prefix, within
  f32 rounding: a step's convolution over its window sums in another order than the whole
  sequence's (1.9e-6 at most here, transformers' own cached decode the same).
- bf16: re-running the prefix bit for bit, this module's forward and transformers' uncached
  one, and transformers' tokens. transformers' cached logits differ from its own uncached
  ones by up to 0.031: it rounds the SSM state to bf16 between steps, which this cache holds
  in f32, so they are not compared bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from cases import MAMBA, f32_and_bf16, lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import generate
from sx2torch.runtime.cache import Cache, generating

SIZES = MAMBA
RUNS = {"generate-exact": torch.float32, "generate": torch.bfloat16}
STEPS = 16


def mamba(run: str):
    path = lisp("mamba")
    source = (
        path.read_text() + "\n(defrun generate-exact :precision :f32 :generate true)\n"
    )
    return load_module(compile_source(source, path.name, Options(run=run))).Mamba


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """{run: transformers' model}: random weights away from their initial ones, in f32 and
    as from_pretrained(..., dtype=bf16) loads them."""
    import transformers

    torch.manual_seed(0)
    f32, bf16 = f32_and_bf16(
        transformers.MambaForCausalLM(transformers.MambaConfig(**SIZES)),
        tmp_path_factory.mktemp("mamba"),
    )
    return {"generate-exact": f32, "generate": bf16}


def loaded(real, run: str):
    model = mamba(run)(**SIZES)
    model.load_state_dict(real[run].state_dict(), strict=True)
    return model


def prompt(length: int = 12) -> torch.Tensor:
    return torch.randint(
        0, 256, (2, length), generator=torch.Generator().manual_seed(1)
    )


def transformers_generate(reference, ids):
    return reference.generate(
        ids,
        do_sample=False,
        max_new_tokens=STEPS,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )


def last_logits(model, tokens, length: int, step: int) -> torch.Tensor:
    """The last position's logits of a forward over the prefix a step reads, re-run whole."""
    with torch.no_grad():
        out = model(tokens[:, : length + step])
    out = getattr(out, "logits", out)
    return out[:, -1].float()


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_f32_generate_is_transformers_cached_generate_bit_for_bit(
    real, static, monkeypatch
):
    """The static cache (its steps run eagerly here) holds the same states in place."""
    torch.set_num_threads(1)
    monkeypatch.setattr(torch, "compile", lambda module, **options: module)
    reference, model, ids = (
        real["generate-exact"],
        loaded(real, "generate-exact"),
        prompt(),
    )
    want = transformers_generate(reference, ids)
    tokens, logits = generate(
        model, ids, STEPS, return_logits=True, static_cache=static
    )
    assert torch.equal(tokens, want.sequences)
    assert len(logits) == len(want.logits) == STEPS
    for step, (got, expected) in enumerate(zip(logits, want.logits)):
        assert got.dtype == torch.float32 and got.shape == (2, 256)
        assert torch.equal(got, expected), f"step {step}"
        again = last_logits(model, tokens, ids.shape[1], step)
        torch.testing.assert_close(got, again, rtol=0, atol=1e-5)


def test_bf16_generate_is_rerunning_the_prefix_bit_for_bit(real):
    torch.set_num_threads(1)
    reference, model, ids = real["generate"], loaded(real, "generate"), prompt()
    tokens, logits = generate(model, ids, STEPS, return_logits=True)
    assert torch.equal(tokens, transformers_generate(reference, ids).sequences)
    for step, got in enumerate(logits):
        assert torch.equal(got, last_logits(model, tokens, ids.shape[1], step))
        assert torch.equal(got, last_logits(reference, tokens, ids.shape[1], step))


@pytest.mark.parametrize("run", RUNS)
def test_the_cache_holds_each_state_in_the_dtype_its_op_reads_it_in(real, run):
    """Per layer, the convolution's last K - 1 = 3 inputs [B, inner, 3] in the run's dtype
    (a copy of what it read), then the scan's state [B, inner, state] in f32; a forward
    outside `generating` keeps nothing and gives every position."""
    model, ids = loaded(real, run), prompt(5)
    read = []
    model.backbone.layers[0].mixer.conv1d.register_forward_hook(
        lambda module, args, out: read.append(args[0])
    )
    cache = Cache()
    with torch.no_grad(), generating(cache):
        cache.begin(0)
        out = model(ids)
    assert out.shape == (2, 1, 256) and out.dtype == RUNS[run]
    conv, scan = ((2, 128, 3), RUNS[run]), ((2, 128, 8), torch.float32)
    assert [(t.shape, t.dtype) for t in cache.states] == [conv, scan, conv, scan]
    assert torch.equal(cache.states[0], read[0][..., -3:].to(RUNS[run]))
    with torch.no_grad():
        assert model(ids).shape == (2, 5, 256)


def test_left_padded_prompts_are_refused_with_a_recurrent_state(real):
    model = loaded(real, "generate-exact")
    ids = torch.zeros(2, 4, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with pytest.raises(
        ValueError, match="left-padded prompts cannot start a recurrent"
    ):
        generate(model, ids, 2, attention_mask=mask)
