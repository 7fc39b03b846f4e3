"""The script's `generate` command (runtime/generate_cli.py): its arguments, and the weights
it reads from what a training run leaves (a run's folder, one checkpoint, model.pt)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import load_module
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import checkpoint, generate, generate_cli, train
from sx2torch.runtime.data import DataError

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"loss": "loss", "optimizers": []}  # the generate command reads none of them


@pytest.fixture(scope="module")
def tiny_gpt():
    source = (ROOT / "examples" / "tiny-gpt.lisp").read_text(encoding="utf-8")
    return load_module(compile_source(source, "tiny-gpt.lisp")).TinyGpt


@pytest.fixture(scope="module")
def saved(tiny_gpt, tmp_path_factory):
    """(a run's folder holding checkpoints step-1 and step-2 and model.pt, the weights of
    step 2): what a training run leaves."""
    out = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = tiny_gpt(vocab=32, d=16)
    optimizers = [torch.optim.AdamW(model.parameters())]
    identity = checkpoint.identity(model)
    for step in (1, 2):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        checkpoint.save(out, step, model, optimizers, identity, keep=2)
    checkpoint.export(model, out / "model.pt")
    return out, {n: t.clone() for n, t in model.state_dict().items()}


def script(tiny_gpt, capsys, *argv) -> tuple:
    """(exit status, stdout, stderr) of `python model.py generate ARGV`."""
    with pytest.raises(SystemExit) as exit:
        train.main(lambda: tiny_gpt(vocab=32, d=16), SETTINGS, ["generate", *argv])
    out, err = capsys.readouterr()
    return exit.value.code, out, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt-ids", "1,2"], "the following arguments are required: --checkpoint"),
        (["--checkpoint", "r", "--prompt-ids", "1,x"], "'1,x': comma-separated token"),
        (["--checkpoint", "r", "--prompt-ids", "1,-2"], "'1,-2': token ids are >= 0"),
        (["--checkpoint", "r", "--prompt-ids", "1", "--max-new-tokens", "0"], "N >= 1"),
        (
            ["--checkpoint", "r", "--prompt-ids", "1", "--temperature", "0"],
            "temperature must be greater than 0",
        ),
        (
            ["--checkpoint", "r", "--prompt-ids", "1", "--top-p", "2"],
            "top_p must be between 0 and 1",
        ),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tiny_gpt, capsys, argv, message):
    code, out, err = script(tiny_gpt, capsys, *argv)
    assert code == 2 and out == ""
    assert message in err.splitlines()[-1]


def test_help_names_the_options(tiny_gpt, capsys):
    code, out, _ = script(tiny_gpt, capsys, "--help")
    assert code == 0
    for option in ("--checkpoint", "--prompt-ids", "--max-new-tokens", "--top-k"):
        assert option in out


def equal_weights(model, expected: dict) -> bool:
    state = model.state_dict()
    return state.keys() == expected.keys() and all(
        torch.equal(state[n], t) for n, t in expected.items()
    )


def test_reads_a_run_its_newest_checkpoint_and_its_final_weights(tiny_gpt, saved):
    out, weights = saved
    for path in (out, out / "checkpoints" / "step-2", out / "model.pt"):
        model = tiny_gpt(vocab=32, d=16)
        generate_cli.load(model, path)
        assert equal_weights(model, weights), path
    older = tiny_gpt(vocab=32, d=16)
    generate_cli.load(older, out / "checkpoints" / "step-1")
    assert not equal_weights(older, weights)


def test_a_path_that_holds_no_weights_is_one_line(tiny_gpt, saved, tmp_path, capsys):
    out, _ = saved
    garbage = tmp_path / "model.pt"
    garbage.write_bytes(b"not a state_dict")
    cases = [
        (tmp_path / "none", "--checkpoint .*none: no such file or folder"),
        (tmp_path, "--checkpoint: no checkpoint in "),
        (garbage, "--checkpoint .*model.pt: not TinyGpt's weights"),
    ]
    for path, message in cases:
        with pytest.raises(DataError, match=message):
            generate_cli.load(tiny_gpt(vocab=32, d=16), path)
    other = tiny_gpt(vocab=32, d=8)
    with pytest.raises(DataError, match="parameters differ from this TinyGpt's"):
        generate_cli.load(other, out)
    with pytest.raises(DataError, match="model.pt: not TinyGpt's weights"):
        generate_cli.load(other, out / "model.pt")
    code, stdout, err = script(
        tiny_gpt, capsys, "--checkpoint", str(tmp_path / "none"), "--prompt-ids", "1"
    )
    assert (code, stdout) == (2, "")
    assert err.startswith("error: --checkpoint ") and err.count("\n") == 1


ENCODER_DECODER = "\n(defrun chat :precision :f32 :generate decoder-input-ids)\n"


def test_an_encoder_decoder_generates_from_its_decoders_start_token(tmp_path, capsys):
    """T5's port, tiny: the prompt is the encoder's, the tokens printed the decoder's, as
    `generate(..., decoder_start_token_id=0)` gives them; without the start token, or with
    it for a decoder alone, one line and exit 2."""
    from cases import T5

    source = (ROOT / "examples" / "t5.lisp").read_text(encoding="utf-8")
    code = compile_source(source + ENCODER_DECODER, "t5.lisp", Options(run="chat"))
    t5 = load_module(code).T5
    torch.manual_seed(0)
    model = t5(**T5).eval()
    checkpoint.export(model, tmp_path / "model.pt")
    settings = dict(SETTINGS, encoder_decoder=True)
    argv = [
        "generate",
        "--checkpoint",
        str(tmp_path / "model.pt"),
        "--prompt-ids",
        "1,2,3",
    ]
    with pytest.raises(SystemExit) as exit:
        train.main(lambda: t5(**T5), settings, argv + ["--decoder-start-token-id", "0"])
    out, _ = capsys.readouterr()
    want = generate(model, torch.tensor([[1, 2, 3]]), 32, decoder_start_token_id=0)
    assert exit.value.code == 0 and out == ",".join(map(str, want[0].tolist())) + "\n"
    with pytest.raises(SystemExit) as exit:
        train.main(lambda: t5(**T5), settings, argv)
    assert exit.value.code == 2
    assert (
        "--decoder-start-token-id: an encoder-decoder's decoder starts from it, give it"
        in (capsys.readouterr().err)
    )


def test_a_decoder_alone_refuses_a_decoder_start_token(tiny_gpt, saved, capsys):
    code, out, err = script(
        tiny_gpt,
        capsys,
        "--checkpoint",
        str(saved[0]),
        "--prompt-ids",
        "1",
        "--decoder-start-token-id",
        "0",
    )
    assert code == 2 and out == ""
    assert err.splitlines()[-1].endswith("and this model is not one")


def test_the_script_of_an_encoder_decoders_run_says_it_is_one():
    source = (
        "(defparam e (normal [16 8]))\n"
        "(defun forward (prompt ids)\n"
        "  (matmul (attention (take e ids) (take e ids) (take e ids) :causal true)"
        " (transpose e [1 0])))\n"
        "(defun loss (prompt ids) (mean (forward prompt ids)))\n"
        "(defrun train :loss loss :generate ids :batch-size 2 :seq-len 4)\n"
    )
    assert '"encoder_decoder": True' in compile_source(source, "m.lisp")
