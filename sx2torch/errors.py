"""The two kinds of error: a located user error, and everything else (a compiler bug)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Optional

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
    """A problem with the source program, reported at a position. Once `located` in a file,
    `str()` is the command line's diagnostic, and `filename`, `line` and `column` say where.
    """

    def __init__(self, span: Span, message: str):
        super().__init__(message)
        self.span = span
        self.message = message
        self.filename: Optional[str] = None
        self.text: Optional[str] = None

    @property
    def line(self) -> int:
        return self.span.line

    @property
    def column(self) -> int:
        return self.span.col

    def located(self, filename: str, text: str) -> "SourceError":
        self.filename, self.text = filename, text
        return self

    def __str__(self) -> str:
        if self.filename is None:
            return self.message
        return self.render(self.filename, self.text)

    def render(self, filename: str, text: str, severity: str = "error") -> str:
        """`FILE:LINE:COL: error: MESSAGE`, then the source line and a caret under the column."""
        lines = [
            *source_lines(text),
            "",
        ]  # an error at the end may sit after the last "\n"
        head = f"{terminal_safe(filename)}:{self.span.line}:{self.span.col}: {severity}: {self.message}"
        if not 1 <= self.span.line <= len(lines) or not text:
            return head
        line, col = _window(lines[self.span.line - 1], self.span.col)
        return f"{head}\n  {line}\n  {' ' * (col - 1)}^"


def source_lines(text: str) -> list:
    """The source's lines as the reader counts them, at "\n" only (a form feed or U+2028
    inside a line does not end it), without a line's "\r"."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def terminal_safe(text: str) -> str:
    """`text` with every character a terminal would act on (ESC, a line break, ...) escaped."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


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
