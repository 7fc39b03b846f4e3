"""Where a module goes: standard output, or the file `-o` names. A write that fails is a
UsageError (exit 2) with the system's reason, never a compiler bug."""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from pathlib import Path

from sx2torch.errors import UsageError

TEMPORARY = (
    ".sx2torch-"  # + PID-RANDOM.tmp: short, so a 255-byte file name still has room
)


def to_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as error:
        if error.errno == errno.EPIPE:
            # Nobody reads: point stdout at /dev/null so the interpreter's last flush is quiet.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise UsageError(
            f"cannot write to standard output: {error.strerror or error}"
        ) from None


def to_file(name: str, text: str) -> None:
    """A regular file (or a symlink's target) is replaced atomically: readers see old or new,
    never half. A FIFO or a device is written into, as a shell's `>` would."""
    path = Path(os.path.realpath(name))
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise UsageError(f"cannot write {name}: {error.strerror}") from None
    if mode is None or stat.S_ISREG(mode):
        _replace(path, name, text)
    else:
        _write_into(path, name, text)


def _write_into(path: Path, name: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
    except OSError as error:
        raise UsageError(f"cannot write {name}: {error.strerror}") from None


def _replace(path: Path, name: str, text: str) -> None:
    """Write a temporary beside `path`, then rename it over `path`."""
    _remove_orphans(path.parent)
    try:
        fd, temporary = tempfile.mkstemp(
            prefix=f"{TEMPORARY}{os.getpid()}-", suffix=".tmp", dir=path.parent
        )
    except OSError as error:
        raise UsageError(f"cannot write {name}: {error.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), _mode(path))
        os.replace(temporary, path)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        raise UsageError(f"cannot write {name}: {error.strerror}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _remove_orphans(directory: Path) -> None:
    """Temporaries left by a run that was killed (kill -9 skips our cleanup): their process is gone."""
    try:
        leftovers = list(directory.glob(f"{TEMPORARY}*-*.tmp"))
    except OSError:
        return
    for leftover in leftovers:
        pid = leftover.name.removeprefix(TEMPORARY).split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                leftover.unlink()
            except OSError:  # gone already, or not ours to remove: harmless either way
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, as another user's process
        return True
    return True


def _mode(path: Path) -> int:
    """The permissions of the file being replaced, or what a new file gets (mkstemp's are 0600)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
