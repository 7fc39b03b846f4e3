"""The two kinds of error: a located user error, and everything else (a compiler bug)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

SHOWN_WIDTH = 100  # a longer source line is shown as a window around the column


@dataclass(frozen=True, order=True)
class Span:
    """A 1-based line and column in the source file."""

    line: int
    col: int


def suggest(name: str, known) -> str:
    """` (did you mean 'x'?)` for the known name closest to a misspelled one, else nothing."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


class UsageError(Exception):
    """A command-line option the source cannot satisfy, such as an unknown --run (exit 2)."""


class SourceError(Exception):
    """A problem with the source program, reported at a position."""

    def __init__(self, span: Span, message: str):
        super().__init__(message)
        self.span = span
        self.message = message

    def render(self, filename: str, text: str) -> str:
        """`FILE:LINE:COL: error: MESSAGE`, then the source line and a caret under the column."""
        lines = text.split("\n")  # the reader counts lines at "\n" only
        head = f"{filename}:{self.span.line}:{self.span.col}: error: {self.message}"
        if not 1 <= self.span.line <= len(lines) or not text:
            return head
        line, col = _window(lines[self.span.line - 1].removesuffix("\r"), self.span.col)
        return f"{head}\n  {line}\n  {' ' * (col - 1)}^"


def _window(line: str, col: int) -> tuple:
    """The line made safe for a terminal (one printable character per column), cut to a window around `col`."""
    line = "".join(c if c.isprintable() else ("?" if c != "\t" else " ") for c in line)
    if len(line) <= SHOWN_WIDTH:
        return line, col
    start = max(0, min(col - 1 - SHOWN_WIDTH // 2, len(line) - SHOWN_WIDTH))
    shown = line[start : start + SHOWN_WIDTH]
    prefix = "..." if start else ""
    suffix = "..." if start + SHOWN_WIDTH < len(line) else ""
    return prefix + shown + suffix, col - start + len(prefix)
