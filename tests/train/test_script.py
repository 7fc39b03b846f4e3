"""The generated file as a training script: on one process, resumed, interrupted, and given
bad data (test_distributed.py runs it under torchrun). A small tiny-gpt (vocab 64, d 32) on a noisy bigram
chain, 30 steps of Muon and AdamW with a cooldown and gradient clipping."""

from __future__ import annotations

import json
import os
import runpy
import struct
import sys
from pathlib import Path

import pytest
import torch

import forked
from sx2torch.compiler import compile_source
from sx2torch.runtime.data import write_shard

ROOT = Path(__file__).resolve().parents[2]
STEPS = 30
SHARDS = ("--data", "shard_*.bin")
DRIVE = str(Path(__file__).with_name("drive.py"))


def small_gpt(schedule: bool = True) -> str:
    text = (ROOT / "examples" / "tiny-gpt.lisp").read_text(encoding="utf-8")
    changes = [
        ("(defconst vocab 512)", "(defconst vocab 64)"),
        ("(defconst d 128)", "(defconst d 32)"),
        (":seq-len 64", ":seq-len 16"),
        (":steps 50", f":steps {STEPS}"),
    ]
    if not schedule:
        changes.append(("  :schedule (:warmup 0.0 :cooldown 0.5)\n", ""))
    for old, new in changes:
        assert old in text
        text = text.replace(old, new)
    return text


def chain(n: int, vocab: int = 64) -> torch.Tensor:
    """A bigram chain, next = (5 t + 3) mod vocab, with 20% of the tokens random."""
    generator = torch.Generator().manual_seed(0)
    noise = torch.rand(n, generator=generator) < 0.2
    random = torch.randint(vocab, (n,), generator=generator)
    ids = [1]
    for i in range(1, n):
        ids.append(int(random[i]) if noise[i] else (5 * ids[-1] + 3) % vocab)
    return torch.tensor(ids)


# rms-mlp trained on inputs the script draws (no data files)
SYNTHETIC = (
    "(defrun train :precision :bf16 :loss loss :steps 12\n"
    "  :optimizer (adamw :lr 0.01) :inputs ((x [32 d-in]) (labels [32] :high n-class)))"
)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The scripts, their data, and the runs that start afresh, made in one launch of
    tests/train/drive.py (each as `python SCRIPT ARGS` runs it, one Python start for all):
    gpt.py's 30 steps (`one`), flat.py's 30 (`whole`) and its first 15 (`halves`), and
    rms-mlp's 12 on synthetic inputs (`mlp`)."""
    folder = tmp_path_factory.mktemp("train")
    for name, schedule in (("gpt.py", True), ("flat.py", False)):
        code = compile_source(small_gpt(schedule), "tiny-gpt.lisp")
        (folder / name).write_text(code, encoding="utf-8")
    source = (ROOT / "examples" / "rms-mlp.lisp").read_text(encoding="utf-8")
    train_run = "(defrun train :precision :bf16)"
    assert train_run in source
    source = source.replace(train_run, SYNTHETIC)
    (folder / "mlp.py").write_text(compile_source(source, "rms-mlp.lisp"))
    write_shard(folder / "shard_000.bin", chain(6000))
    write_shard(folder / "shard_001.bin", chain(3000))
    runs = [
        ["gpt.py", *SHARDS, "--out", "one"],
        ["flat.py", *SHARDS, "--out", "whole"],
        ["flat.py", *SHARDS, "--out", "halves", "--steps", "15"],
        ["mlp.py", "--out", "mlp"],
    ]
    code, err = train(folder, DRIVE, *joined(runs))
    assert code == 0, err
    return folder


def environment() -> dict:
    """The environment of the scripts' runs: this checkout's sx2torch, one thread."""
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def train(work: Path, script: str, *args: str, interrupt: int = 0) -> tuple:
    """(exit status, stderr) of `python SCRIPT ARGS`, forked (tests/forked.py), interrupted
    by Ctrl-C after `interrupt` steps when given (tests/train/interrupt.py). It waits for
    the process without a timeout: on a loaded machine a run takes what it takes."""
    wrapper = [str(Path(__file__).with_name("interrupt.py")), str(interrupt)]
    return forked.python(
        work, *(wrapper if interrupt else []), script, *args, env=environment()
    )


def joined(runs: list) -> list:
    """tests/train/drive.py's arguments for these runs: each one's, separated by `;`."""
    return [arg for i, run in enumerate(runs) for arg in ([";"] if i else []) + run]


def losses(work: Path, out: str) -> list:
    lines = (work / out / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == list(range(len(records)))
    return [r["loss"] for r in records]


@pytest.fixture(scope="module")
def reference(work) -> list:
    return losses(work, "one")


def test_one_process_trains(work, reference):
    assert len(reference) == STEPS
    assert (
        abs(reference[0] - torch.log(torch.tensor(64.0)).item()) < 1e-3
    )  # a zero head
    assert sum(reference[-5:]) / 5 < 0.6 * reference[0]
    record = json.loads((work / "one" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record.keys() == {"step", "loss", "lr", "tokens_per_s"}
    assert record["lr"] == pytest.approx(
        0.02 * (1 / STEPS) / 0.5
    )  # the last cooldown step
    assert record["tokens_per_s"] > 0
    assert (work / "one" / "checkpoints" / "latest").read_text() == f"step-{STEPS}\n"


def test_resumed_run_equals_an_uninterrupted_one(work):
    assert losses(work, "halves") == losses(work, "whole")[:15]
    code, err = train(work, "flat.py", *SHARDS, "--out", "halves", "--resume")
    assert code == 0, err
    assert losses(work, "halves") == losses(work, "whole")


def test_ctrl_c_saves_and_resume_finishes(work, reference):
    code, err = train(work, "gpt.py", *SHARDS, "--out", "stopped", interrupt=3)
    assert code == 130, err
    assert (
        "interrupted: saved step 4 in stopped/checkpoints/step-4; --resume continues"
        in err
    )
    assert len(losses(work, "stopped")) == 4
    code, err = train(work, "gpt.py", *SHARDS, "--out", "stopped", "--resume")
    assert code == 0, err
    assert losses(work, "stopped") == reference


def test_synthetic_inputs_train_with_adamw(work):
    first, *_, last = losses(work, "mlp")
    assert (
        last < 0.5 * first
    )  # a fresh batch each step, but of random labels: memorised


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "the file is empty, expected a token shard"),
        (b"\0" * 1024 + b"\1\0" * 8, "not a token shard (magic number 0, expected 20240520)"),
        (struct.pack("<3i", 20240520, 1, 16).ljust(1024, b"\0") + b"\0" * 8, "truncated: holds 4 tokens, its header says 16"),
        (None, ""),
    ],
    ids=["empty", "magic", "truncated", "no-match"],
)  # fmt: skip
def test_bad_data_is_one_line_and_exit_2(
    work, tmp_path, content, message, monkeypatch, capsys
):
    """Run in this process as `python gpt.py` runs it (the other tests launch the script):
    the data is checked before the model is built or the seed set, so no state is left.
    """
    if content is None:
        data, expected = (
            str(tmp_path / "none_*.bin"),
            f"error: --data {tmp_path}/none_*.bin: no file matches",
        )
    else:
        data = str(tmp_path / "bad.bin")
        Path(data).write_bytes(content)
        expected = f"error: {data}: {message}"
    script = str(work / "gpt.py")
    monkeypatch.setattr(
        sys, "argv", [script, "--data", data, "--out", str(tmp_path / "run")]
    )
    with pytest.raises(SystemExit) as exit:
        runpy.run_path(script, run_name="__main__")
    out, err = capsys.readouterr()
    assert (exit.value.code, err, out) == (2, expected + "\n", "")
