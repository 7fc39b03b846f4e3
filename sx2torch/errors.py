"""The two kinds of error: a located user error, and everything else (a compiler bug)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Span:
    """A 1-based line and column in the source file."""

    line: int
    col: int


class SourceError(Exception):
    """A problem with the source program, reported at a position."""

    def __init__(self, span: Span, message: str):
        super().__init__(message)
        self.span = span
        self.message = message

    def render(self, filename: str, text: str) -> str:
        lines = text.splitlines()
        head = f"{filename}:{self.span.line}:{self.span.col}: error: {self.message}"
        if not 1 <= self.span.line <= len(lines):
            return head
        source_line = lines[self.span.line - 1].expandtabs(1)
        caret = " " * (self.span.col - 1) + "^"
        return f"{head}\n  {source_line}\n  {caret}"
