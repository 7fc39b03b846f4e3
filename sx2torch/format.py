"""Pass 7, format: the emitted module's text -> black's formatting of it.

Black is the formatter of record, and most of a compile's time: it parses and formats the
module twice (a second pass settles the trailing commas the first one adds), whatever the
shape of its input. Its result depends only on the text, black's version and its mode, so
it is kept in a user-level cache by content hash, and compiling or `check`ing an unchanged
model again skips black. The cache is the folder $SX2TORCH_CACHE_DIR, else
$XDG_CACHE_HOME/sx2torch, else ~/.cache/sx2torch; SX2TORCH_NO_CACHE=1 turns it off. An
entry that cannot be read or written is as if absent: the cache never fails a compile.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Optional

import black

MODE = black.Mode()
KEPT = 256  # entries kept; the oldest beyond that are removed when one is added


def run(code: str) -> str:
    folder = cache_dir()
    if folder is None:
        return black.format_str(code, mode=MODE)
    key = hashlib.sha256(
        f"{black.__version__}\0{MODE!r}\0{code}".encode("utf-8", "surrogatepass")
    )
    entry = folder / f"{key.hexdigest()}.py"
    try:
        formatted = entry.read_text(encoding="utf-8")
        os.utime(entry)  # pruning removes the least recently used
        return formatted
    except (OSError, UnicodeDecodeError):
        pass
    formatted = black.format_str(code, mode=MODE)
    _store(folder, entry, formatted)
    return formatted


def cache_dir() -> Optional[Path]:
    """The cache's folder, or None when it is turned off."""
    if os.environ.get("SX2TORCH_NO_CACHE"):
        return None
    if os.environ.get("SX2TORCH_CACHE_DIR"):
        return Path(os.environ["SX2TORCH_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "sx2torch"
    try:
        return Path.home() / ".cache" / "sx2torch"
    except RuntimeError:  # no home directory to be found
        return None


def _store(folder: Path, entry: Path, text: str) -> None:
    """Write `entry` whole or not at all (a reader never sees half of one), then prune."""
    temporary = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, entry)
        temporary = None
        entries = sorted(folder.glob("*.py"), key=_age)
        for old in entries[:-KEPT]:
            old.unlink(missing_ok=True)
    except (OSError, UnicodeError):
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def _age(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
