"""Where in the .lisp a generated module's error is: `model.lisp:LINE:COL`, the line and a caret.

Nothing in the generated file and nothing on the call path: when an exception escapes to the
top (`sys.excepthook`, or IPython's display of it), each traceback frame in a file whose
header says sx2torch made it is mapped to its source form. The public API finds its source and
compiles it again with the header's flags and `--source-lines` (`sx2torch.api.source_of`,
`recompile`), whose code has the same statements as the module's (the comments aside, which
name each statement's form); a module whose statements differ is stale and is not mapped.
Nothing here imports the compiler: the API imports it when an error is first shown.
"""

from __future__ import annotations

import ast
import linecache
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Optional

import sx2torch.api as api
from sx2torch.errors import SourceError, Span, UsageError

MARK = re.compile(r"# (?:.*):(\d+):(\d+)$")


def locate(error: BaseException) -> list:
    """`FILE:LINE:COL: error: in FORM`-style lines, with the source line and a caret, for each
    frame of the error's traceback in a generated module, innermost first."""
    found = []
    tb = error.__traceback__
    while tb is not None:
        file, line = tb.tb_frame.f_code.co_filename, tb.tb_lineno
        if api.HEADER.match(linecache.getline(file, 1)):
            where = _where(file, line)
            if where:
                found.append(where)
        tb = tb.tb_next
    return found[::-1]


def _where(module: str, line: int) -> Optional[str]:
    table = _table(module)
    if table is None:
        return None
    source, spans = table
    span = spans.get(line)
    if span is None:
        return None
    text = Path(source).read_text("utf-8", errors="replace")
    shown = SourceError(
        Span(*span),
        f"the error is raised in this form ({Path(module).name}, line {line})",
    )
    return shown.render(source, text, "note")


@lru_cache(maxsize=64)
def _table(module: str) -> Optional[tuple]:
    """(source file, {module line: (source line, column)}), or None where the source is not
    found or the module is stale."""
    code = Path(module).read_text("utf-8")
    source = api.source_of(module)
    if source is None:
        return None
    try:
        marked = api.recompile(code, source, source_lines=True)
    except (OSError, SourceError, UsageError):
        return None
    ours, theirs = _statements(code), _statements(marked)
    if [ast.dump(s) for s in ours] != [ast.dump(s) for s in theirs]:
        return None
    lines = marked.splitlines()
    spans = {}
    for mine, statement in zip(ours, theirs):
        for number in range(statement.lineno, statement.end_lineno + 1):
            mark = MARK.search(lines[number - 1])
            if mark:
                span = (int(mark[1]), int(mark[2]))
                spans.update((n, span) for n in range(mine.lineno, mine.end_lineno + 1))
                break
    return str(source), spans


def _statements(code: str) -> list:
    """The simple statements, in order (a compound one's own line has no mark)."""
    return [
        node
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.stmt)
        and not isinstance(
            node, (ast.ClassDef, ast.FunctionDef, ast.With, ast.For, ast.If)
        )
    ]


def annotate(error: BaseException) -> list:
    """Add `locate`'s lines to the error as notes (shown after its traceback), once."""
    notes = [] if getattr(error, "_sx2torch_located", False) else locate(error)
    error._sx2torch_located = True
    if hasattr(error, "add_note"):  # Python 3.11
        for note in notes:
            error.add_note(note)
    return notes


def _excepthook(kind, error, tb, shown=sys.excepthook):
    notes = annotate(error) if isinstance(error, Exception) else []
    shown(kind, error, tb)
    if not hasattr(error, "add_note"):
        print("\n".join(notes), file=sys.stderr)


def _ipython_hook(shell, kind, error, tb, tb_offset=None):
    annotate(error)
    shell.showtraceback((kind, error, tb), tb_offset=tb_offset)


def install() -> None:
    """Show the source of an error that escapes to the top, in a script and in IPython."""
    if getattr(sys.excepthook, "__module__", None) != __name__:
        sys.excepthook = _excepthook
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    if shell is not None and not shell.custom_exceptions:
        shell.set_custom_exc((Exception,), _ipython_hook)
