"""`--data` of named tensors (`.pt` or `.safetensors` files whose keys are the loss's
arguments) for a loss that is not `(inputs targets)` on token shards: a small convnet on
images, a regression on (src tgt) pairs, and tiny-gpt given its batches as tensors; and the
`--data` a run cannot use, refused in one line. The scripts run in this process, as
test_faults.py runs them."""

from __future__ import annotations

import runpy

import pytest
import torch

from sx2torch.compiler import compile_source
from sx2torch.runtime.data import write_shard
from train.test_faults import lines, losses, run, source as gpt_source
from train.test_script import ROOT, chain

IMAGES = """\
(defrun train :precision :f32 :loss loss :steps 6 :optimizer (adamw :lr 0.01)
  :inputs ((images [8 1 8 8]) (labels [8] :high num-classes)))
"""

PAIRS = """\
(defparam w (zeros [4 4]))
(defparam b (zeros [4]))
(defun forward (src) (+ (matmul src w) b))
(defun loss (src tgt) (mean (square (- (forward src) tgt))))
(defrun train :loss loss :steps 200 :optimizer (adamw :lr 0.05 :weight-decay 0.0)
  :inputs ((src [16 4]) (tgt [16 4])))
"""


def convnet() -> str:
    text = (ROOT / "examples" / "convnet.lisp").read_text(encoding="utf-8")
    changes = [
        ("(defconst channels 16)", "(defconst channels 4)"),
        ("(defconst depth 2)", "(defconst depth 1)"),
        ("(defrun train :precision :bf16)\n(defrun exact :precision :f32)\n", IMAGES),
    ]
    for old, new in changes:
        assert old in text
        text = text.replace(old, new)
    return text


def image_set(rows: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "images": torch.randn(rows, 1, 8, 8, generator=generator),
        "labels": torch.randint(4, (rows,), generator=generator),
    }


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    folder = tmp_path_factory.mktemp("named")
    (folder / "convnet.py").write_text(compile_source(convnet(), "convnet.lisp"))
    (folder / "pairs.py").write_text(compile_source(PAIRS, "pairs.lisp"))
    (folder / "gpt.py").write_text(compile_source(gpt_source(), "tiny-gpt.lisp"))
    torch.save(image_set(8, seed=5), folder / "one-batch.pt")
    torch.save(image_set(20, seed=1), folder / "images.pt")
    write_shard(folder / "shard.bin", chain(2000))
    return folder


def test_the_first_step_trains_on_the_data(work, capfd):
    """One batch of data: step 0's batch is its 8 rows in some order, and its loss is the
    model's loss on them (batch statistics and the mean are blind to the order)."""
    code, err = run(
        work, capfd, "--out", "one", script="convnet.py", data="one-batch.pt"
    )
    assert code == 0, err
    torch.manual_seed(0)  # the script's initial parameters: --seed 0
    model = runpy.run_path(str(work / "convnet.py"))["Convnet"]()
    expected = model.loss(**torch.load(work / "one-batch.pt")).item()
    assert losses(work / "one")[0] == pytest.approx(expected, rel=1e-5)
    code, err = run(work, capfd, "--out", "synthetic", script="convnet.py", data=None)
    assert code == 0, err
    assert losses(work / "synthetic")[0] != pytest.approx(expected, rel=1e-2)


def test_a_resumed_run_reads_what_an_uninterrupted_one_reads(work, capfd):
    """20 rows in batches of 8: a new order every 2 steps, drawn from the seed."""
    whole = losses_of(work, capfd, "whole", "images.pt")
    half = losses_of(work, capfd, "half", "images.pt", "--steps", "3")
    assert half == whole[:3]
    assert losses_of(work, capfd, "half", "images.pt", "--resume") == whole
    safetensors = pytest.importorskip("safetensors.torch")
    safetensors.save_file(torch.load(work / "images.pt"), work / "images.safetensors")
    assert losses_of(work, capfd, "safe", "images.safetensors") == whole
    assert losses_of(work, capfd, "seed", "images.pt", "--seed", "1") != whole


def losses_of(work, capfd, out: str, data: str, *args: str) -> list:
    code, err = run(work, capfd, "--out", out, *args, script="convnet.py", data=data)
    assert code == 0, err
    return losses(work / out)


def test_a_source_target_model_learns_its_pairs(work, capfd):
    generator = torch.Generator().manual_seed(2)
    src = torch.randn(64, 4, generator=generator)
    mapping = torch.randn(4, 4, generator=generator)
    torch.save({"src": src, "tgt": src @ mapping}, work / "pairs.pt")
    code, err = run(work, capfd, "--out", "pairs", script="pairs.py", data="pairs.pt")
    assert code == 0, err
    trained = torch.load(work / "pairs" / "model.pt")["w"]
    assert torch.allclose(
        trained, mapping, atol=0.01
    )  # a fixed random batch cannot teach it


def test_a_token_run_takes_its_batches_as_named_tensors(work, capfd):
    """tiny-gpt's first batch of 2 x 16 tokens from the shard, given as tensors named after
    the loss's arguments, gives the shard's first loss."""
    code, err = run(work, capfd, "--out", "shard", "--steps", "1")
    assert code == 0, err
    tokens = chain(2000)[:33]
    batch = {"idx": tokens[:-1].view(2, 16), "targets": tokens[1:].view(2, 16)}
    torch.save(batch, work / "tokens.pt")
    code, err = run(work, capfd, "--out", "tokens", "--steps", "1", data="tokens.pt")
    assert code == 0, err
    assert losses(work / "tokens") == pytest.approx(losses(work / "shard"), rel=1e-5)


def test_data_a_run_cannot_use_is_one_line(work, capfd):
    torch.save({"x": torch.zeros(8, 1, 8, 8), "y": torch.zeros(8)}, work / "bad.pt")
    (work / "mix.pt").write_bytes((work / "bad.pt").read_bytes())
    write_shard(work / "mix.bin", chain(100))
    cases = [
        ("shard.bin", "error: --data shard.bin: the loss takes images, labels: give .pt or .safetensors files of tensors with these names (token shards feed only a run without :inputs)"),
        ("bad.pt", "error: bad.pt: its tensors are named x, y; the loss takes images, labels"),
        ("mix.*", "error: --data mix.*: mix.bin is not a .pt or .safetensors file like mix.pt: give files of one kind"),
    ]  # fmt: skip
    for data, message in cases:
        code, err = run(work, capfd, "--out", "refused", script="convnet.py", data=data)
        assert (code, lines(err)) == (2, [message]), data
    code, err = run(work, capfd, data="bad.pt")  # a token run is told its names
    assert (code, lines(err)) == (2, [
        "error: bad.pt: its tensors are named x, y; the loss takes idx, targets"
    ])  # fmt: skip


def test_help_names_the_tensors_data_holds(work, capsys):
    assert run(work, None, "--help", script="convnet.py", data=None)[0] == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--data GLOB .pt or .safetensors files of tensors named images, labels "
        "(batches drawn along the first axis); default: the synthetic :inputs batch"
    ) in text
    assert "--decay-vectors" in text
    assert "the order named tensors are drawn in (default: 0)" in text  # 0 is a default


def test_decay_vectors_holds_when_a_run_resumes(work, capfd):
    """A checkpoint keeps the weight decay of its optimizer's groups; a resumed run uses its
    own command line's: with --decay-vectors the norms' gains decay from then on."""
    for out, flags in (("decayed", ["--decay-vectors"]), ("kept", [])):
        code, err = run(
            work, capfd, "--out", out, "--steps", "3", script="convnet.py", data=None
        )
        assert code == 0, err
        code, err = run(
            work,
            capfd,
            "--out",
            out,
            "--resume",
            *flags,
            script="convnet.py",
            data=None,
        )
        assert code == 0, err
    decayed, kept = (torch.load(work / out / "model.pt") for out in ("decayed", "kept"))
    assert losses(work / "decayed")[:4] == losses(work / "kept")[:4]
    assert not torch.equal(decayed["stem_bn.weight"], kept["stem_bn.weight"])


def test_a_checkpoint_of_other_optimizer_groups_is_one_line(work, capfd):
    """Without weight decay an optimizer has one group; with it, matrices and vectors each
    have their own: a checkpoint of the one does not load into the other."""
    code, err = run(
        work, capfd, "--out", "groups", "--steps", "2", script="pairs.py", data=None
    )
    assert code == 0, err
    decaying = PAIRS.replace(":weight-decay 0.0", ":weight-decay 0.1")
    (work / "decaying.py").write_text(compile_source(decaying, "pairs.lisp"))
    code, err = run(
        work, capfd, "--out", "groups", "--resume", script="decaying.py", data=None
    )
    assert (code, lines(err)) == (2, [
        "warning: groups/checkpoints/step-2 was saved by another version of Pairs's file; "
        "its parameters match",
        "error: --resume: groups/checkpoints/step-2 does not fit this run's optimizers: "
        "RuntimeError: Missing key in checkpoint state_dict: optim.param_groups.1.weight_decay."
    ])  # fmt: skip
