"""`sx2torch check`: is each generated module what its source compiles to now?

Paths pair like this: `NAME.lisp GENERATED.py` (the .py right after its source), `NAME.lisp`
alone with the NAME.py beside it, and a directory with every NAME.lisp below it (hidden folders
skipped). Each module is compiled again with the flags its header records, unless the command
line gives them."""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from sx2torch.compiler import TARGETS, Options, flags
from sx2torch.errors import UsageError

HEADER_FLAGS = re.compile(r"^# Do not edit: .*\(flags: (.*)\)\.$", re.MULTILINE)


@dataclass(frozen=True)
class Verdict:
    """What checking one pair found: `diff` (unified, for stdout) and `message` (for stderr)."""

    status: int  # 0 fresh, 1 stale or missing
    diff: str = ""
    message: str = ""


def pairs(paths: list) -> list:
    """(source, generated) for the paths given on the command line, in order."""
    found = []
    i = 0
    while i < len(paths):
        path = Path(paths[i])
        following = paths[i + 1] if i + 1 < len(paths) else None
        if path.is_dir():
            found += [
                (source, source.with_suffix(".py"))
                for source in sorted(path.rglob("*.lisp"))
                if not any(
                    part.startswith(".") for part in source.relative_to(path).parts[:-1]
                )
            ]
        elif path.suffix == ".lisp" and following and following.endswith(".py"):
            found.append((path, Path(following)))
            i += 1
        elif path.suffix == ".lisp":
            found.append((path, path.with_suffix(".py")))
        else:
            raise UsageError(
                f"{path}: give a NAME.lisp (checked against the NAME.py beside it), "
                "a NAME.lisp followed by its module, or a directory"
            )
        i += 1
    return found


def recorded(committed: str) -> dict:
    """The options a module's header says it was compiled with (none for a hand-made file)."""
    match = HEADER_FLAGS.search("".join(committed.splitlines(keepends=True)[:2]))
    if match is None:
        return {}
    try:
        tokens = shlex.split(match[1])
    except ValueError:
        return {}
    options = {}
    for flag, value in zip(tokens, [*tokens[1:], None]):
        if flag == "--run" and value:
            options["run"] = value
        elif flag == "--target" and value in TARGETS:
            options["target"] = value
        elif flag == "--source-lines":
            options["source_lines"] = True
    return options


def options_for(committed: Optional[str], given: dict) -> Options:
    """The header's options, each replaced by the one the command line gives."""
    chosen = recorded(committed or "")
    chosen.update({key: value for key, value in given.items() if value is not None})
    return Options(**chosen)


def verdict(
    source: Path, generated: Path, committed: Optional[str], code: str, options
) -> Verdict:
    again = shlex.join(
        [
            "sx2torch",
            str(source),
            *flags(options.run, options.target, options.source_lines),
            "-o",
            str(generated),
        ]
    )
    if committed is None:
        return Verdict(1, message=f"{generated} does not exist; generate it: {again}")
    if committed == code:
        return Verdict(0)
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        code.splitlines(keepends=True),
        fromfile=str(generated),
        tofile=f"{generated} (compiled from {source})",
    )
    return Verdict(1, "".join(diff), f"{generated} is stale; regenerate it: {again}")
