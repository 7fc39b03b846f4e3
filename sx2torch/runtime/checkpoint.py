"""Training checkpoints: saved whole or not at all, verified before they are read.

`DIR/checkpoints/step-N` is a `torch.distributed.checkpoint` folder (each rank writes its own
shards) with `manifest.json`: the SHA-256 of every file and the model it belongs to (class,
the name and shape of every `state_dict` entry, the SHA-256 of the generated file). A save
writes `step-N.partial`, checksums it, and only then renames it `step-N`, points `latest` at
it and removes the oldest beyond `--keep`; a failed save leaves no folder behind. `--resume`
takes the newest checkpoint that verifies, naming in a warning each newer one that did not.

torch.distributed.checkpoint is imported by the functions that read or write one: a run
that saves at its end does not wait for it before its first step.

For inference: `load_checkpoint(model, DIR)` loads the newest verified checkpoint's weights
into a plain generated module; `DIR/model.pt` is the final weights as one `state_dict`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from sx2torch.runtime.data import DataError

__all__ = ["CheckpointError", "identity", "load_checkpoint", "export"]

MANIFEST = "manifest.json"
STEP = re.compile(r"step-(\d+)")


class CheckpointError(DataError):
    """A checkpoint that cannot be written or read, in one line."""


def identity(model: torch.nn.Module) -> dict:
    """What a checkpoint records of its model (taken before the model is sharded)."""
    module = sys.modules.get(type(model).__module__)
    path = getattr(module, "__file__", None)
    return {
        "class": type(model).__name__,
        "source_sha256": _digest(Path(path)) if path else None,
        "state": {name: list(t.shape) for name, t in model.state_dict().items()},
    }


def save(out: Path, step: int, model, optimizers, model_id: dict, keep: int) -> Path:
    """Checkpoint step `step` (every rank calls this); the folder written."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = out / "checkpoints"
    final, partial = folder / f"step-{step}", folder / f"step-{step}.partial"
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
    model_state, optim_state = get_state_dict(model, optimizers)
    try:
        with _quiet_without_group():
            dcp.save(
                {"model": model_state, "optim": optim_state}, checkpoint_id=partial
            )
        failure = (
            _publish(folder, partial, final, step, model_id, keep)
            if rank == 0
            else None
        )
    except CheckpointException as error:
        failure = _first_failure(error)
    except OSError as error:
        failure = _os_failure(error)
    if dist.is_initialized():
        shared = [failure]
        dist.broadcast_object_list(shared, src=0)
        failure = failure or shared[0]
    if failure:
        if rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
        kept = newest(folder)
        raise CheckpointError(
            f"saving step {step} in {folder}: {failure}; "
            + (
                f"the latest checkpoint is still {kept.name}"
                if kept
                else "no checkpoint is kept"
            )
        )
    return final


def _publish(
    folder: Path, partial: Path, final: Path, step: int, model_id, keep
) -> None:
    files = {
        str(f.relative_to(partial)): _digest(f)
        for f in sorted(partial.rglob("*"))
        if f.is_file()
    }
    manifest = {"step": step, "model": model_id, "files": files}
    _write_atomically(partial / MANIFEST, json.dumps(manifest).encode())
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    try:
        _write_atomically(folder / "latest", f"{final.name}\n".encode())
    except OSError:
        shutil.rmtree(final)  # `latest` still names the one before
        raise
    steps = sorted(_steps(folder), reverse=True)
    for older in [s for s in steps if s > step] + [s for s in steps if s < step][
        keep - 1 :
    ]:
        shutil.rmtree(
            folder / f"step-{older}"
        )  # after `step`: a timeline resumed before it
    return None


def _write_atomically(path: Path, data: bytes) -> None:
    part = path.with_name(path.name + ".tmp")
    try:
        with open(part, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)


def _steps(folder: Path) -> list:
    return [
        int(m.group(1))
        for p in (folder.iterdir() if folder.is_dir() else [])
        if p.is_dir() and (m := STEP.fullmatch(p.name))
    ]


def newest(folder: Path):
    """The newest step folder, verified or not; None when there is none."""
    steps = _steps(folder)
    return folder / f"step-{max(steps)}" if steps else None


def verify(checkpoint: Path, model_id: dict):
    """Why `checkpoint` cannot be resumed into the model `model_id` describes; None if it can."""
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
        files, recorded = manifest["files"], manifest["model"]
    except FileNotFoundError:
        return f"no {MANIFEST} (an unfinished save, or not written by sx2torch)"
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST} is not a manifest"
    mismatch = _model_mismatch(recorded, model_id)
    if mismatch:
        return mismatch
    for name, digest in files.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if _digest(path) != digest:
            return f"{name} does not match its checksum"
    return None


def _model_mismatch(recorded: dict, model_id: dict):
    if recorded.get("class") != model_id["class"]:
        return f"it holds a {recorded.get('class')}, not a {model_id['class']}"
    theirs, ours = recorded.get("state", {}), model_id["state"]
    differ = sorted(
        n for n in theirs.keys() | ours.keys() if theirs.get(n) != ours.get(n)
    )
    if differ:
        shown = ", ".join(differ[:3]) + (
            f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        )
        return f"its parameters differ from this {model_id['class']}'s: {shown}"
    return None


def resume_point(out: Path, model_id: dict, warn, asked: str = "--resume") -> Path:
    """The newest checkpoint in `out` that verifies; each newer one that does not is named in
    a warning, as is a newer one that `latest` names and that is gone, and when none
    verifies the error names why the newest did not, after `asked`, what asked for it.
    """
    folder = out / "checkpoints"
    steps = sorted(_steps(folder), reverse=True)
    gone = _missing_latest(folder)
    if not steps:
        raise CheckpointError(
            f"{asked}: no checkpoint in {out}"
            + (
                f" (checkpoints/latest names {gone.name}, which is missing)"
                if gone
                else ""
            )
        )
    failed = []
    for step in steps:
        checkpoint = folder / f"step-{step}"
        reason = verify(checkpoint, model_id)
        if reason is None:
            if gone and _step(gone) > step:
                warn(
                    f"{folder / 'latest'} names {gone.name}, which is missing; "
                    f"resuming from {checkpoint.name}"
                )
            for name, why in failed:
                warn(f"{name} is not resumed: {why}; resuming from {checkpoint.name}")
            return checkpoint
        failed.append((checkpoint, reason))
    (first, why), others = failed[0], len(failed) - 1
    more = (
        f" ({others} older {'ones fail' if others > 1 else 'one fails'} too)"
        if others
        else ""
    )
    raise CheckpointError(f"{asked}: {first}: {why}{more}")


def _missing_latest(folder: Path):
    """The step folder `latest` names when that folder is gone (deleted by hand, or lost);
    None when it is there, or `latest` names no step."""
    try:
        named = (folder / "latest").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not STEP.fullmatch(named) or (folder / named).is_dir():
        return None
    return folder / named


def _step(checkpoint: Path) -> int:
    return int(STEP.fullmatch(checkpoint.name).group(1))


def source_changed(checkpoint: Path, model_id: dict) -> bool:
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    return manifest["model"].get("source_sha256") != model_id["source_sha256"]


def load(checkpoint: Path, model, optimizers) -> int:
    """Load a verified checkpoint into the (possibly sharded) model and its optimizers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizers)
    state = {"model": model_state, "optim": optim_state}
    try:
        with _quiet_without_group():
            dcp.load(state, checkpoint_id=checkpoint)
    except CheckpointException as error:  # verified, but saved for other groups
        raise CheckpointError(
            f"--resume: {checkpoint} does not fit this run's optimizers: "
            f"{_first_failure(error)}"
        ) from None
    set_state_dict(
        model,
        optimizers,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
    )
    return _step(checkpoint)


def load_checkpoint(
    model: torch.nn.Module, path, asked: str = "load_checkpoint", warn=warnings.warn
) -> int:
    """Load into `model` (a generated module, unsharded) the weights of the newest verified
    checkpoint of a run's DIR, or of the checkpoint folder `path` names; the step it holds.
    A checkpoint that does not verify raises CheckpointError, its message led by `asked`;
    a newer one passed over is said through `warn`."""
    import torch.distributed.checkpoint as dcp

    path, model_id = Path(path), identity(model)
    if STEP.fullmatch(path.name):
        reason = verify(path, model_id)
        if reason:
            raise CheckpointError(f"{asked}: {path}: {reason}")
        checkpoint = path
    else:
        checkpoint = resume_point(path, model_id, warn, asked)
    state = {"model": model.state_dict()}
    with _quiet_without_group():
        dcp.load(state, checkpoint_id=checkpoint)
    model.load_state_dict(state["model"], strict=True)
    return _step(checkpoint)


def export(model, path: Path) -> None:
    """The whole model's weights as one `state_dict` file (`torch.save`), written by rank 0:
    `Model().load_state_dict(torch.load(path), strict=True)` loads it."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    part = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, part)
        part.replace(path)
    except OSError as error:
        raise CheckpointError(f"writing {path}: {_os_failure(error)}") from None
    finally:
        part.unlink(missing_ok=True)


def _digest(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _os_failure(error: OSError) -> str:
    return error.strerror or str(error)


def _first_failure(error) -> str:
    """The first rank's cause of a CheckpointException, in one line."""
    rank, (cause, _) = min(error.failures.items())
    text = (
        _os_failure(cause)
        if isinstance(cause, OSError)
        else f"{type(cause).__name__}: {cause}"
    )
    return f"rank {rank}: {text}" if dist.is_initialized() else text


@contextlib.contextmanager
def _quiet_without_group():
    """DCP warns when there is no process group that it reads or writes as one process,
    which is what a run without --parallel means."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        yield
