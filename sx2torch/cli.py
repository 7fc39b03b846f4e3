"""The command line: compile, check, explain. Exit 0 on success, 1 on a diagnostic
about the source (or a stale or missing module for `check`), 2 on bad command-line usage
or a file that cannot be read or written, 3 on an internal compiler error."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import sx2torch.api as api
import sx2torch.output as output
from sx2torch.compiler import (
    DUMPS,
    PASSES,
    STDIN,
    TARGETS,
    Options,
    compile_module,
    compile_source,
)
from sx2torch.errors import SourceError, UsageError, terminal_safe
from sx2torch.version import __version__

USAGE = """\
sx2torch FILE.lisp [-o OUT.py] [--run NAME] [--target cuda|metal|cpu]
       sx2torch check [FILE.lisp [GENERATED.py] | FILE.lisp:GENERATED.py | DIRECTORY ...]
       sx2torch explain FILE.lisp [--run NAME] [--json | --html OUT.html]
       sx2torch run FILE.lisp --input NAME=FILE.pt ... [--method NAME] [--params STATE.pt]
FILE.lisp may be - for standard input."""
DESCRIPTION = """\
Compile a SexpGPU model into a readable PyTorch module.

commands:
  (default)   compile FILE.lisp and print the module (or write it with -o)
  check       exit 1 with a unified diff when GENERATED.py (default: the module
              pyproject.toml's [tool.sx2torch] modules names, else NAME.py beside
              NAME.lisp; every NAME.lisp under a DIRECTORY; with no paths, those
              modules names) is not what its source compiles to with the flags
              its header records
  explain     say where the precision policy keeps f32, and list parameter sizes
  run         evaluate a defun with the interpreter, without generating code

A compile runs these passes in order (--dump-after prints the output of one):
  {passes}"""


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = (
        argv[0]
        if argv and argv[0] in ("check", "explain", "compile", "run")
        else "compile"
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
        _say(f"sx2torch: error: {error}")
        return 2
    except SourceError as error:
        _say(str(error))
        return 1
    # anything else is a bug in the compiler, not in the source
    except Exception as error:
        if args.traceback:
            traceback.print_exc()
        else:
            _say(
                f"sx2torch: internal compiler error: {type(error).__name__}: {_one_line(str(error))} "
                "(a bug in sx2torch: please report it with the source file; --traceback shows where)"
            )
        return 3


def _say(message: str) -> None:
    """A message on stderr, each line safe for a terminal (a file name may hold an ESC)."""
    print("\n".join(map(terminal_safe, message.split("\n"))), file=sys.stderr)


def _one_line(text: str, width: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sx2torch" if command == "compile" else f"sx2torch {command}",
        usage=USAGE,
        description=DESCRIPTION.format(passes=" -> ".join(p.name for p in PASSES)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "check":
        parser.add_argument(
            "paths",
            nargs="*",
            help="sources (each optionally followed by its module) and directories",
        )
    else:
        parser.add_argument("file", help="the SexpGPU source file (- reads stdin)")
    if command == "compile":
        parser.add_argument("-o", "--output", help="write the module here, atomically")
        parser.add_argument(
            "--warn",
            choices=("all", "error", "none"),
            default="all",
            help="print warnings (all, the default), make them errors, or print none",
        )
    if command == "run":
        from sx2torch.interpret import command as run  # imports torch: only for `run`

        run.arguments(parser)
    if command == "explain":
        parser.add_argument(
            "--json", action="store_true", help="machine-readable output"
        )
        parser.add_argument(
            "--html", metavar="FILE", help="write the report as one HTML page instead"
        )
    _options(parser, command)
    return parser


def _options(parser: argparse.ArgumentParser, command: str) -> None:
    """The options every command takes, after its own."""
    recorded = "the one the module's header records"
    parser.add_argument(
        "--run",
        help=f"the defrun to compile for (default: {recorded if command == 'check' else 'the first'})",
    )
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default=None if command == "check" else "cuda",
        help=f"the device family (default: {recorded if command == 'check' else 'cuda'})",
    )
    if command in ("compile", "check"):
        parser.add_argument(
            "--source-lines",
            action="store_true",
            default=None if command == "check" else False,
            help="add a `# FILE:LINE` comment to each statement",
        )
    if command == "compile":
        parser.add_argument(
            "--dump-after",
            choices=DUMPS,
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


@dataclasses.dataclass(frozen=True)
class _Source:
    name: str  # as diagnostics name it: <stdin> for -
    text: str  # as read, for the line a diagnostic quotes
    code: str  # decoded, for the compiler

    @contextmanager
    def located(self):
        """A diagnostic raised inside names this file and quotes its text."""
        try:
            yield
        except SourceError as error:
            raise error.located(self.name, self.text)


def _source(file: str) -> _Source:
    name = STDIN if file == "-" else file
    text, code = api.decoded(api.read(file), name)
    return _Source(name, text, code)


def _compile_command(args) -> int:
    if args.output == "":
        raise UsageError("-o: the file name is empty")
    options = Options(
        run=args.run,
        target=args.target,
        source_lines=args.source_lines,
        dump_after=args.dump_after,
    )
    _refuse_own_source(args.file, args.output, "-o")
    source = _source(args.file)
    with source.located():
        compiled = compile_module(source.code, source.name, options)
    severity = "error" if args.warn == "error" else "warning"
    if args.warn != "none":
        for found in compiled.warnings:
            error = SourceError(found.span, found.message)
            _say(error.render(source.name, source.text, severity))
    if compiled.warnings and args.warn == "error":
        return 1
    if args.output is None:
        output.to_stdout(compiled.code)
    else:
        output.to_file(args.output, compiled.code)
    return 0


def _refuse_own_source(source: str, out: Optional[str], option: str) -> None:
    try:
        same = out is not None and source != "-" and os.path.samefile(source, out)
    except OSError:  # one of them does not exist (yet): not the same file
        return
    if same:
        raise UsageError(f"{option} {out}: that is the source file; name another")


def _check_command(args) -> int:
    # here, not at the top: a compile, the common command, does not import check's
    # modules (tomllib among them) at start-up
    from sx2torch.tools import check

    given = {"run": args.run, "target": args.target, "source_lines": args.source_lines}
    found = check.pairs(args.paths)
    if not found:
        raise UsageError(
            "check: give sources or directories, or name the pairs in pyproject.toml's [tool.sx2torch] modules"
        )
    return max(_check_pair(source, generated, given) for source, generated in found)


def _check_pair(source: Path, generated: Path, given: dict) -> int:
    """0 fresh, 1 stale, missing or a diagnostic, 2 unreadable; reported, and on to the next."""
    from sx2torch.tools import check  # imported by _check_command, which calls this

    try:
        committed = _committed(generated)
        options = check.options_for(committed, given)
        read = _source(str(source))
        with read.located():
            try:
                code = compile_source(read.code, read.name, options)
            except UsageError:
                if given["run"] or options.run is None:
                    raise
                # The run the header records is gone from the source: the module is stale.
                options = dataclasses.replace(options, run=None)
                code = compile_source(read.code, read.name, options)
    except UsageError as error:
        _say(f"sx2torch: error: {error}")
        return 2
    except SourceError as error:
        _say(str(error))
        return 1
    found = check.verdict(source, generated, committed, code, options)
    output.to_stdout(found.diff)
    if found.message:
        _say(f"sx2torch check: {found.message}")
    return found.status


def _committed(generated: Path) -> Optional[str]:
    """The module's text, or None when there is none."""
    try:
        return generated.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UsageError(f"cannot read {generated}: {error.strerror}") from None


def _explain_command(args) -> int:
    # here: a compile, the command a start-up is felt in, needs neither
    from sx2torch.tools import explain
    from sx2torch.tools import report as report_page

    _refuse_own_source(args.file, args.html, "--html")
    source = _source(args.file)
    with source.located():
        report = explain.run(
            source.code, source.name, Options(run=args.run, target=args.target)
        )
    if args.html:
        output.to_file(args.html, report_page.render(report, source.code))
        return 0
    output.to_stdout(explain.to_json(report) if args.json else explain.render(report))
    return 0


def _run_command(args) -> int:
    from sx2torch.interpret import command  # torch, which compiling never imports

    source = _source(args.file)
    with source.located():
        return command.run(args, source.code, source.name)


COMMANDS = {
    "run": _run_command,
    "compile": _compile_command,
    "check": _check_command,
    "explain": _explain_command,
}
