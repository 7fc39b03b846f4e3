"""The command line: compile, check, explain. Exit 0 on success, 1 on a diagnostic
about the source (or a stale file for `check`), 2 on bad command-line usage."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Optional

from sx2torch import __version__, dump, explain
from sx2torch import report as report_page
from sx2torch.compiler import TARGETS, Options, compile_source
from sx2torch.errors import SourceError, UsageError
from sx2torch.read import decode

USAGE = """\
sx2torch FILE.lisp [-o OUT.py] [--run NAME] [--target cuda|metal|cpu]
       sx2torch check FILE.lisp GENERATED.py [--run NAME] [--target ...]
       sx2torch explain FILE.lisp [--run NAME] [--json | --html OUT.html]"""
DESCRIPTION = """\
Compile a SexpGPU model into a readable PyTorch module.

commands:
  (default)   compile FILE.lisp and print the module (or write it with -o)
  check       exit 1 with a unified diff when GENERATED.py is not what FILE.lisp compiles to
  explain     say where the precision policy keeps f32, and list parameter sizes"""


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = (
        argv[0] if argv and argv[0] in ("check", "explain", "compile") else "compile"
    )
    rest = argv[1:] if argv and argv[0] == command else argv
    parser = _parser(command)
    try:
        args = parser.parse_args(rest)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        return COMMANDS[command](args)
    except UsageError as error:
        print(f"sx2torch: error: {error}", file=sys.stderr)
        return 2
    except SourceError as error:
        print(error.render(args.file, getattr(args, "text", "")), file=sys.stderr)
        return 1
    except (
        Exception
    ) as error:  # anything else is a bug in the compiler, not in the source
        if args.traceback:
            traceback.print_exc()
        else:
            print(
                f"sx2torch: internal compiler error: {type(error).__name__}: {_one_line(str(error))} "
                "(a bug in sx2torch: please report it with the source file; --traceback shows where)",
                file=sys.stderr,
            )
        return 1


def _one_line(text: str, width: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sx2torch" if command == "compile" else f"sx2torch {command}",
        usage=USAGE,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", help="the SexpGPU source file")
    if command == "check":
        parser.add_argument("generated", help="the committed Python module to check")
    if command == "compile":
        parser.add_argument("-o", "--output", help="write the module here, atomically")
    if command == "explain":
        parser.add_argument(
            "--json", action="store_true", help="machine-readable output"
        )
        parser.add_argument(
            "--html", metavar="FILE", help="write the report as one HTML page instead"
        )
    parser.add_argument("--run", help="the defrun to compile for (default: the first)")
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="cuda",
        help="the device family (default: cuda)",
    )
    if command in ("compile", "check"):
        parser.add_argument(
            "--source-lines",
            action="store_true",
            help="add a `# FILE:LINE` comment to each statement",
        )
    if command == "compile":
        parser.add_argument(
            "--dump-after",
            choices=dump.PASSES,
            help="print that pass's output instead of the module, for debugging",
        )
    parser.add_argument(
        "--traceback",
        action="store_true",
        help="show the traceback of an internal error",
    )
    parser.add_argument(
        "--version", action="version", version=f"sx2torch {__version__}"
    )
    return parser


def _source(args) -> str:
    try:
        data = Path(args.file).read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read {args.file}: {error.strerror}") from None
    args.text = data.decode("utf-8", errors="replace").removeprefix(
        "\ufeff"
    )  # for showing a diagnostic's line
    return decode(data)


def _compile(args) -> str:
    options = Options(
        run=args.run,
        target=args.target,
        source_lines=getattr(args, "source_lines", False),
        dump_after=getattr(args, "dump_after", None),
    )
    return compile_source(_source(args), args.file, options)


def _compile_command(args) -> int:
    code = _compile(args)
    if args.output:
        _write_atomically(Path(args.output), code)
    else:
        sys.stdout.write(code)
    return 0


def _write_atomically(path: Path, text: str) -> None:
    """Write a sibling temporary file, then rename it over `path`: readers see old or new, never half."""
    try:
        fd, temporary = tempfile.mkstemp(
            prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
        )
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), _mode(path))
        os.replace(temporary, path)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        raise UsageError(f"cannot write {path}: {error.strerror}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _mode(path: Path) -> int:
    """The permissions of the file being replaced, or what a new file gets (mkstemp's are 0600)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _check_command(args) -> int:
    code = _compile(args)
    try:
        committed = Path(args.generated).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read {args.generated}: {error}") from None
    if committed == code:
        return 0
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        code.splitlines(keepends=True),
        fromfile=args.generated,
        tofile=f"{args.generated} (compiled from {args.file})",
    )
    sys.stdout.writelines(diff)
    print(
        f"sx2torch check: {args.generated} is stale; regenerate it from {args.file}",
        file=sys.stderr,
    )
    return 1


def _explain_command(args) -> int:
    text = _source(args)
    report = explain.run(text, args.file, Options(run=args.run, target=args.target))
    if args.html:
        try:
            Path(args.html).write_text(report_page.render(report, text), "utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {args.html}: {error.strerror}") from None
        return 0
    sys.stdout.write(explain.to_json(report) if args.json else explain.render(report))
    return 0


COMMANDS = {
    "compile": _compile_command,
    "check": _check_command,
    "explain": _explain_command,
}
