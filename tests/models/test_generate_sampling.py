"""Sampling end to end (issue 36): the Llama port's cached generate with do_sample=True,
temperature 0.8, top-k 50 and top-p 0.9 draws transformers' tokens from the same seed, the
f32 run against the f32 model and the bf16 run against from_pretrained(dtype=bf16), three
seeds; and the script's `generate` command decodes a training checkpoint as the driver does.
"""

from __future__ import annotations

import pytest
import torch

from cases import LLAMA, f32_and_bf16, lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import train
from sx2torch.runtime.generate import generate

SIZES = LLAMA
PRECISIONS = {"f32": torch.float32, "bf16": torch.bfloat16}
SAMPLING = dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9)
NEW_TOKENS = 12
EOS = 2  # LlamaConfig's, which transformers' generate stops at and pads with


def cached_llama(precision: str) -> type:
    """examples/llama.lisp compiled for a generate run of `precision`."""
    source = lisp("llama").read_text(encoding="utf-8")
    source += f"\n(defrun sampled :precision :{precision} :generate true)\n"
    code = compile_source(source, "llama.lisp", Options(run="sampled"))
    return load_module(code).Llama


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """{precision: transformers' Llama}: random weights moved off their initial values (so
    that every parameter counts), in f32 and as from_pretrained(dtype=bf16) loads them.
    """
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SIZES, attn_implementation="sdpa")
    f32, bf16 = f32_and_bf16(
        transformers.LlamaForCausalLM(config), tmp_path_factory.mktemp("llama")
    )
    return {"f32": f32, "bf16": bf16}


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_sampled_tokens_are_transformers_from_the_same_seed(real, precision):
    theirs = real[precision]
    ours = cached_llama(precision)(**SIZES)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    ours.eval()
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(5))
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        with torch.no_grad():
            expected = theirs.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=NEW_TOKENS,
                **SAMPLING,
            )
        generator = torch.Generator().manual_seed(seed)
        got = generate(
            ours, prompt, NEW_TOKENS, generator=generator, eos_token_id=EOS, **SAMPLING
        )
        assert torch.equal(got, expected), (precision, seed)
    # the seeds draw different continuations: the comparison is of sampled tokens
    runs = {
        tuple(generate(ours, prompt, NEW_TOKENS, generator=g, **SAMPLING)[0].tolist())
        for g in (torch.Generator().manual_seed(s) for s in (0, 1, 2))
    }
    assert len(runs) == 3


def test_the_generate_command_decodes_a_checkpoint(real, tmp_path, capsys):
    """A checkpoint saved as training saves it, decoded by `python model.py generate`: the
    tokens the driver gives the same weights, greedy and sampled."""
    from sx2torch.runtime import checkpoint

    cls = cached_llama("f32")
    model = cls(**SIZES)
    model.load_state_dict(real["f32"].state_dict(), strict=True)
    optimizers = [torch.optim.AdamW(model.parameters())]
    checkpoint.save(tmp_path, 3, model, optimizers, checkpoint.identity(model), keep=1)
    prompt = [5, 17, 42, 7]
    settings = {"loss": "loss", "optimizers": []}
    for options, sampling in [
        ([], {}),
        (["--temperature", "0.8", "--top-k", "50", "--seed", "4"], SAMPLING),
    ]:
        argv = ["generate", "--checkpoint", str(tmp_path), "--prompt-ids"]
        argv += [",".join(map(str, prompt)), "--max-new-tokens", "9", *options]
        with pytest.raises(SystemExit) as exit:
            train.main(lambda: cls(**SIZES), settings, argv)
        out, err = capsys.readouterr()
        assert exit.value.code == 0, err
        if sampling:
            sampling = dict(
                sampling, top_p=None, generator=torch.Generator().manual_seed(4)
            )
        want = generate(model.eval(), torch.tensor([prompt]), 9, **sampling)
        assert out == ",".join(map(str, want[0].tolist())) + "\n"
