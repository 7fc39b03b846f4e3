"""The training script under faults, on one process: corrupted, missing and foreign
checkpoints, a diverging run, bad arguments and data, a full disk; each is one line and a
nonzero exit, or a warning and a run that goes on from an intact checkpoint. And what a
run leaves for inference: `load_checkpoint` and `model.pt`.

The script runs in this process (runpy, as `python model.py` runs it) to keep the tests fast;
a full disk is a write made to fail with ENOSPC partway through."""

from __future__ import annotations

import errno
import json
import os
import re
import runpy
import shutil
import sys
from pathlib import Path

import pytest
import torch

from sx2torch.compiler import compile_source
from sx2torch.runtime.checkpoint import CheckpointError, load_checkpoint
from sx2torch.runtime.data import write_shard
from train.test_script import chain, small_gpt

STEPS = 6
SMALL = "(defconst n-layer 1)"


# a learning rate that makes exp overflow at the second step
WILD = """\
(defparam w (normal [8 1] :std 0.1))
(defun forward (x) (matmul x w))
(defun loss (x) (mean (exp (forward x))))
(defrun train :loss loss :steps 6 :optimizer (adamw :lr 1e6) :inputs ((x [4 8])))
"""


def source() -> str:
    text = small_gpt(schedule=False).replace(":steps 30", f":steps {STEPS}")
    text = text.replace("(defconst n-layer 2)", SMALL)
    return text.replace(":batch-size 8", ":batch-size 2")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("faults")
    (folder / "gpt.py").write_text(compile_source(source(), "tiny-gpt.lisp"))
    (folder / "wild.py").write_text(compile_source(WILD, "wild.lisp"))
    other = source().replace("(defconst d 32)", "(defconst d 16)")
    (folder / "other.py").write_text(compile_source(other, "tiny-gpt.lisp"))
    write_shard(folder / "shard.bin", chain(2000))
    return folder


def run(
    work: Path,
    capfd,
    *args: str,
    script: str = "gpt.py",
    data: str | None = "shard.bin",
) -> tuple:
    """(exit status, stderr) of `python SCRIPT --data DATA ARGS` run here (no --data when
    DATA is None); stderr is not read without `capfd`."""
    before = os.getcwd()
    os.chdir(work)
    sys.argv = [script, *(["--data", data] if data else []), *args]
    if capfd:
        capfd.readouterr()
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exit:
        code = exit.code
    finally:
        os.chdir(before)
    return code, capfd.readouterr().err if capfd else None


def lines(err: str) -> list:
    """stderr without tqdm's bar."""
    text = err.replace("\r", "\n")
    return [l for l in text.splitlines() if l.strip() and not re.match(r"\s*\d+%\|", l)]


def losses(folder: Path) -> list:
    def reject(constant):
        raise ValueError(f"not JSON: {constant}")

    text = folder.joinpath("metrics.jsonl").read_text()
    return [json.loads(l, parse_constant=reject)["loss"] for l in text.splitlines()]


@pytest.fixture(scope="module")
def reference(work) -> list:
    assert run(work, None, "--out", "reference")[0] == 0
    return losses(work / "reference")


def saved(work: Path, capfd, out: str) -> Path:
    """A fresh run in OUT with checkpoints at steps 3 and 6."""
    shutil.rmtree(work / out, ignore_errors=True)
    code, err = run(work, capfd, "--out", out, "--save-every", "3")
    assert code == 0, err
    return work / out / "checkpoints"


def flip(path: Path, at: int = 200, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(at, min(at + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_checkpoints_are_kept_and_listed(work, capfd, reference):
    folder = saved(work, capfd, "kept")
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-3", "step-6"]
    manifest = json.loads((folder / "step-6" / "manifest.json").read_text())
    assert manifest["model"]["class"] == "TinyGpt"
    assert manifest["model"]["state"]["wte"] == [64, 32]
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp"]
    assert losses(work / "kept") == reference
    code, err = run(work, capfd, "--out", "kept", "--steps", "9", "--save-every", "3")
    assert code == 0, err  # resumed at 6, saved at 9: step-3 goes, --keep 2
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-6", "step-9"]


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("flip", "__0_0.distcp does not match its checksum"),
        ("truncate", "__0_0.distcp does not match its checksum"),
        ("metadata", ".metadata is missing"),
        (
            "manifest",
            "no manifest.json (an unfinished save, or not written by sx2torch)",
        ),
    ],
)
def test_a_damaged_checkpoint_falls_back_to_the_intact_one(
    work, capfd, reference, damage, why
):
    folder = saved(work, capfd, f"damaged-{damage}")
    newest = folder / "step-6"
    if damage == "flip":
        flip(newest / "__0_0.distcp")
    elif damage == "truncate":
        (newest / "__0_0.distcp").write_bytes(
            (newest / "__0_0.distcp").read_bytes()[:100]
        )
    else:
        (
            newest / {"metadata": ".metadata", "manifest": "manifest.json"}[damage]
        ).unlink()
    code, err = run(work, capfd, "--out", f"damaged-{damage}", "--resume")
    assert code == 0, err
    assert lines(err)[:1] == [
        f"warning: damaged-{damage}/checkpoints/step-6 is not resumed: {why}; "
        "resuming from step-3"
    ], err
    assert (
        losses(work / f"damaged-{damage}") == reference
    )  # steps 3-5 again, bit for bit


OLDER = " (1 older one fails too)"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("flip", "--resume: none-flip/checkpoints/step-6: __0_0.distcp does not match its checksum" + OLDER),
        ("steps", "--resume: no checkpoint in none-steps (checkpoints/latest names step-6, which is missing)"),
        ("other", "--resume: none-other/checkpoints/step-6: its parameters differ from this TinyGpt's: blocks.0.w_down, blocks.0.w_o, blocks.0.w_qkv and 3 more" + OLDER),
    ],
)  # fmt: skip
def test_no_intact_checkpoint_is_one_line(work, capfd, damage, message):
    folder = saved(work, capfd, f"none-{damage}")
    for step in (3, 6):
        if damage == "flip":
            flip(folder / f"step-{step}" / "__0_0.distcp")
        elif damage == "steps":
            shutil.rmtree(folder / f"step-{step}")
    script = "other.py" if damage == "other" else "gpt.py"
    code, err = run(work, capfd, "--out", f"none-{damage}", "--resume", script=script)
    assert (code, lines(err)) == (2, [f"error: {message}"])


@pytest.mark.parametrize("latest", ["", "garbage\n", "step-99\n"])
def test_a_bad_latest_resumes_from_the_newest_intact(work, capfd, reference, latest):
    folder = saved(work, capfd, "latest")
    (folder / "latest").write_text(latest)
    shutil.rmtree(folder / "step-6")
    code, err = run(work, capfd, "--out", "latest", "--resume")
    assert (code, lines(err)[-1]) == (
        0,
        f"done: step {STEPS} in latest/checkpoints/step-6, the final weights in latest/model.pt",
    )
    assert losses(work / "latest") == reference


def test_a_missing_latest_checkpoint_is_named_in_a_warning(work, capfd, reference):
    folder = saved(work, capfd, "gone")
    shutil.rmtree(folder / "step-6")  # `latest` still names it
    code, err = run(work, capfd, "--out", "gone", "--resume")
    assert code == 0, err
    assert lines(err)[0] == (
        "warning: gone/checkpoints/latest names step-6, which is missing; "
        "resuming from step-3"
    )
    assert losses(work / "gone") == reference


def older(folder: Path) -> None:
    """Leave step-3 as the newest checkpoint, as a run stopped there leaves it."""
    shutil.rmtree(folder / "step-6")
    (folder / "latest").write_text("step-3\n")


def test_a_torn_metrics_line_is_dropped_on_resume(work, capfd, reference):
    folder = saved(work, capfd, "torn")
    older(folder)
    metrics = work / "torn" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 6')
    code, err = run(work, capfd, "--out", "torn", "--resume")
    assert code == 0, err
    assert lines(err)[0] == "warning: torn/metrics.jsonl:7: a torn last line, dropped"
    assert losses(work / "torn") == reference


def test_a_diverging_run_stops_and_keeps_its_good_checkpoint(work, capfd):
    shutil.rmtree(work / "wild", ignore_errors=True)
    code, err = run(
        work, capfd, "--out", "wild", "--save-every", "1", script="wild.py", data=None
    )
    records = [
        json.loads(l)
        for l in (work / "wild" / "metrics.jsonl").read_text().splitlines()
    ]
    step = len(records) - 1  # the first step whose loss is not finite
    assert [r["loss"] is None for r in records] == [False] * step + [True]
    assert records[step]["nonfinite"] == "inf" and not records[step]["skipped"]
    assert (code, lines(err)) == (2, [
        f"error: step {step}: the loss is inf; the run stops, the last good checkpoint is "
        f"wild/checkpoints/step-{step} (--on-nan skip skips such steps)"
    ])  # fmt: skip
    folder = work / "wild" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == [
        "latest",
        f"step-{step - 1}",
        f"step-{step}",
    ]
    model = runpy.run_path(str(work / "wild.py"))["Wild"]()
    assert load_checkpoint(model, work / "wild") == step
    assert torch.isfinite(model.w).all()


def test_skipping_non_finite_steps_finishes_the_run(work, capfd):
    shutil.rmtree(work / "skip", ignore_errors=True)
    code, err = run(
        work, capfd, "--out", "skip", "--on-nan", "skip", script="wild.py", data=None
    )
    assert code == 0, err
    records = [
        json.loads(l)
        for l in (work / "skip" / "metrics.jsonl").read_text().splitlines()
    ]
    skipped = [r["step"] for r in records if r.get("skipped")]
    assert len(records) == STEPS and skipped and skipped[-1] == STEPS - 1
    assert all(r["loss"] is None for r in records if r["step"] in skipped)
    assert [l for l in lines(err) if l.startswith("warning")] == [
        f"warning: step {s}: the loss is inf; the step is skipped (--on-nan skip)"
        for s in skipped
    ]
    model = runpy.run_path(str(work / "wild.py"))["Wild"]()
    model.load_state_dict(torch.load(work / "skip" / "model.pt"), strict=True)
    assert torch.isfinite(model.w).all()  # the skipped steps updated nothing


def test_bad_arguments_and_data_are_one_line(work, capfd):
    (work / "a-file").write_text("")
    (work / "dir.bin").mkdir(exist_ok=True)
    write_shard(work / "wide.bin", torch.full((200,), 64))  # vocab is 64: ids 0-63
    cases = [
        (["--out", "a-file"], "error: --out a-file: a file, not a folder"),
        (["--data", "dir.bin"], "error: dir.bin: a directory, expected a token shard"),
        (["--data", "wide.bin", "--out", "wide"], "error: step 0: index 64 is out of bounds for dimension 0 with size 64 (a token id of --data beyond the model's vocabulary?)"),
    ]  # fmt: skip
    for args, message in cases:
        code, err = run(work, capfd, *args)
        assert (code, lines(err)) == (2, [message]), args


def fail_after(limit: int):
    """A write that stops at `limit` bytes in all with ENOSPC, as a full disk does."""
    written = 0
    real = os.write

    def write(fd, data):
        nonlocal written
        room = limit - written
        if room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written += min(room, len(data))
        return real(fd, data[:room])

    return write


def test_a_full_disk_during_metrics_leaves_whole_lines(
    work, capfd, monkeypatch, reference
):
    shutil.rmtree(work / "full", ignore_errors=True)
    monkeypatch.setattr("sx2torch.runtime.metrics.os.write", fail_after(250))
    code, err = run(work, capfd, "--out", "full")
    text = (work / "full" / "metrics.jsonl").read_text()
    assert text.endswith("\n")
    done = len(text.splitlines())
    assert (code, lines(err)) == (2, [
        f"error: full/metrics.jsonl: No space left on device writing step {done}; "
        "the file ends with the step before it"
    ])  # fmt: skip
    assert losses(work / "full") == reference[:done]


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(
    work, capfd, monkeypatch
):
    folder = saved(work, capfd, "disk")
    older(folder)
    from torch.distributed.checkpoint import filesystem

    real = filesystem._write_item

    def full(*args, **kwargs):
        real(*args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(filesystem, "_write_item", full)
    code, err = run(work, capfd, "--out", "disk", "--resume")
    assert (code, lines(err)) == (2, [
        "error: saving step 6 in disk/checkpoints: No space left on device; "
        "the latest checkpoint is still step-3"
    ])  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-3"]
    assert (folder / "latest").read_text() == "step-3\n"


def test_the_final_weights_load_for_inference(work, capfd, reference):
    namespace = runpy.run_path(str(work / "gpt.py"))
    from_checkpoint, from_export = namespace["TinyGpt"](), namespace["TinyGpt"]()
    assert load_checkpoint(from_checkpoint, work / "reference") == STEPS
    from_export.load_state_dict(
        torch.load(work / "reference" / "model.pt"), strict=True
    )
    expected = from_export.state_dict()
    assert all(
        torch.equal(t, expected[n]) for n, t in from_checkpoint.state_dict().items()
    )
    ids = chain(17)[None]
    loss = from_export.loss(ids[:, :-1], ids[:, 1:])
    assert loss < reference[0] - 0.1  # trained: below the first step's loss
    wrong = namespace["TinyGpt"](d=16)
    with pytest.raises(
        CheckpointError, match="its parameters differ from this TinyGpt's"
    ):
        load_checkpoint(wrong, work / "reference" / "checkpoints" / "step-6")


def test_another_version_of_the_file_resumes_with_a_warning(work, capfd, reference):
    folder = saved(work, capfd, "edited")
    older(folder)
    edited = source().replace(":lr 0.02", ":lr 0.01")  # Muon's: the same parameters
    (work / "edited.py").write_text(compile_source(edited, "tiny-gpt.lisp"))
    code, err = run(work, capfd, "--out", "edited", "--resume", script="edited.py")
    assert code == 0, err
    assert lines(err)[0] == (
        "warning: edited/checkpoints/step-3 was saved by another version of TinyGpt's "
        "file; its parameters match"
    )
    edited = losses(work / "edited")
    assert edited[:3] == reference[:3] and edited[3:] != reference[3:]
