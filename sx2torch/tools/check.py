"""`sx2torch check`: is each generated module what its source compiles to now?

Paths pair like this: `NAME.lisp GENERATED.py` (the .py right after its source) or
`NAME.lisp:GENERATED.py`, `NAME.lisp` alone with the module `[tool.sx2torch] modules` in
pyproject.toml names for it, else the NAME.py beside it, and a directory with every NAME.lisp
below it (hidden folders skipped). With no paths, the sources `modules` names are checked. Each
module is compiled again with the flags its header records, unless the command line gives them.

    [tool.sx2torch]
    modules = { "examples/rms-mlp.lisp" = "rms_mlp.py" }  # paths from pyproject.toml's folder
"""

from __future__ import annotations

import difflib
import keyword
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from sx2torch.compiler import TARGETS, Options, flags
from sx2torch.errors import UsageError, terminal_safe

HEADER_FLAGS = re.compile(r"^# Do not edit: .*\(flags: (.*)\)\.$", re.MULTILINE)


@dataclass(frozen=True)
class Verdict:
    """What checking one pair found: `diff` (unified, for stdout) and `message` (for stderr)."""

    status: int  # 0 fresh, 1 stale or missing
    diff: str = ""
    message: str = ""


def pairs(paths: list, modules: Optional[dict] = None) -> list:
    """(source, generated) for the paths given on the command line, in order; `modules`
    maps a source's resolved path to its module's (the configuration's pairs)."""
    modules = configured() if modules is None else modules
    if not paths:
        return [(_relative(s), _relative(g)) for s, g in modules.items()]

    def module_of(source: Path) -> Path:
        generated = modules.get(source.resolve())
        return source.with_suffix(".py") if generated is None else _relative(generated)

    found = []
    i = 0
    while i < len(paths):
        path = Path(paths[i])
        following = paths[i + 1] if i + 1 < len(paths) else None
        source, colon, module = paths[i].rpartition(":")
        if path.is_dir():
            found += [
                (source, module_of(source))
                for source in sorted(path.rglob("*.lisp"))
                if not any(
                    part.startswith(".") for part in source.relative_to(path).parts[:-1]
                )
            ]
        elif colon and source.endswith(".lisp") and module.endswith(".py"):
            found.append((Path(source), Path(module)))
        elif path.suffix == ".lisp" and following and following.endswith(".py"):
            found.append((path, Path(following)))
            i += 1
        elif path.suffix == ".lisp":
            found.append((path, module_of(path)))
        else:
            raise UsageError(
                f"{path}: give a NAME.lisp (checked against the NAME.py beside it), "
                "a NAME.lisp followed by its module, NAME.lisp:MODULE.py, or a directory"
            )
        i += 1
    return found


def configured(start: Optional[Path] = None) -> dict:
    """`[tool.sx2torch] modules` of the nearest pyproject.toml at or above `start` (the
    working folder), as resolved paths; {} where there is none."""
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        project = candidate / "pyproject.toml"
        if project.is_file():
            break
    else:
        return {}
    try:
        table = tomllib.loads(project.read_text("utf-8")).get("tool", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise UsageError(f"cannot read {project}: {error}") from None
    modules = table.get("sx2torch", {}).get("modules", {})
    if not isinstance(modules, dict) or not all(
        isinstance(v, str) for v in modules.values()
    ):
        raise UsageError(
            f"{project}: [tool.sx2torch] modules maps each NAME.lisp to its module's file, "
            'such as { "models/rms-mlp.lisp" = "rms_mlp.py" }'
        )
    return {
        (candidate / source).resolve(): (candidate / module).resolve()
        for source, module in modules.items()
    }


def _relative(path: Path) -> Path:
    """As the user would write it: relative to the working folder where it is below it."""
    try:
        return path.relative_to(Path.cwd().resolve())
    except ValueError:
        return path


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
    def again(module: Path) -> str:
        how = flags(options.run, options.target, options.source_lines)
        return shlex.join(["sx2torch", str(source), *how, "-o", str(module)])

    if committed is None and not _importable(generated.stem):
        named = generated.with_name(_importable_name(generated.stem) + ".py")
        pair = shlex.join(["sx2torch", "check", f"{source}:{named}"])
        return Verdict(
            1,
            message=f"{generated} does not exist, and Python cannot import a module of "
            f"that name; generate it as {named.name}: {again(named)}, then check that "
            f"pair: {pair}",
        )
    if committed is None:
        return Verdict(
            1, message=f"{generated} does not exist; generate it: {again(generated)}"
        )
    if committed == code:
        return Verdict(0)
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        code.splitlines(keepends=True),
        fromfile=terminal_safe(str(generated)),
        tofile=terminal_safe(f"{generated} (compiled from {source})"),
    )
    return Verdict(
        1, "".join(diff), f"{generated} is stale; regenerate it: {again(generated)}"
    )


def _importable(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _importable_name(stem: str) -> str:
    """`mamba-lm` -> `mamba_lm`: each character an identifier cannot hold made `_`."""
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in stem)
    name = name if name[:1].isidentifier() else f"_{name}"
    return name if _importable(name) else f"{name}_"
