"""Pass 1, read: UTF-8 text -> a list of data, each with its line and column.

sexpdata parses the atoms and strings; the brackets, comments and positions are
walked here, iteratively, so that deep nesting cannot exhaust Python's stack and
sexpdata's quirks (``t`` as True, ``nil`` as an empty list, an unterminated
string raising AttributeError) never reach the compiler.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

import sexpdata

from sx2torch.errors import SourceError, Span

MAX_DEPTH = 64
SYMBOL_RE = re.compile(r"[A-Za-z0-9_*+/<>=!?&.%-]+")
TOKEN_RE = re.compile(r"[^\s()\[\]\";]+")
CLOSERS = {"(": ")", "[": "]"}


@dataclass(frozen=True)
class Symbol:
    name: str
    span: Span


@dataclass(frozen=True)
class Keyword:
    name: str
    span: Span


@dataclass(frozen=True)
class Number:
    value: Union[int, float]
    span: Span
    text: str = ""  # as written, for comments that echo the source


@dataclass(frozen=True)
class String:
    value: str
    span: Span


@dataclass(frozen=True)
class Boolean:
    value: bool
    span: Span


@dataclass(frozen=True)
class List:
    items: tuple
    span: Span


@dataclass(frozen=True)
class Vector:
    items: tuple
    span: Span


Datum = Union[Symbol, Keyword, Number, String, Boolean, List, Vector]


class _AtomParser(sexpdata.Parser):
    """sexpdata's atom and string scanner, with no special symbols."""

    def __init__(self, text: str):
        super().__init__(text, nil=None, true=None, false=None)


class _Positions:
    """Maps a string offset to a 1-based line and column."""

    def __init__(self, text: str):
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def span(self, offset: int) -> Span:
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return Span(lo + 1, offset - self.starts[lo] + 1)


def decode(data: bytes) -> str:
    """UTF-8 bytes -> text, or a located error at the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        good = data[: error.start].decode("utf-8")
        raise SourceError(_Positions(good).span(len(good)), "the file is not valid UTF-8")


def run(text: str) -> list[Datum]:
    """Read every top-level datum of a source text."""
    atoms = _AtomParser(text)
    where = _Positions(text)
    top: list = []
    stack: list[tuple[str, int, list]] = []
    items = top
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c == ";":
            newline = text.find("\n", i)
            i = n if newline < 0 else newline + 1
        elif c in CLOSERS:
            if len(stack) >= MAX_DEPTH:
                raise SourceError(where.span(i), f"forms nested deeper than {MAX_DEPTH} levels")
            stack.append((c, i, items))
            items = []
            i += 1
        elif c in ")]":
            if not stack:
                raise SourceError(where.span(i), f"unexpected '{c}' with no open bracket")
            opener, start, outer = stack.pop()
            if CLOSERS[opener] != c:
                raise SourceError(
                    where.span(i), f"'{c}' closes the '{opener}' at {_at(where.span(start))}"
                )
            kind = List if opener == "(" else Vector
            outer.append(kind(tuple(items), where.span(start)))
            items = outer
            i += 1
        elif c == '"':
            i = _read_string(atoms, text, i, where, items)
        else:
            i = _read_atom(atoms, text, i, where, items)
    if stack:
        opener, start, _ = stack[-1]
        raise SourceError(where.span(start), f"'{opener}' is never closed")
    return top


def _at(span: Span) -> str:
    return f"line {span.line}, column {span.col}"


def _read_string(atoms: _AtomParser, text: str, i: int, where: _Positions, items: list) -> int:
    if not re.match(r'"(?:[^"\\]|\\.)*"', text[i:], re.DOTALL):
        raise SourceError(where.span(i), "unterminated string")
    end, value = atoms.parse_str(i)
    items.append(String(value, where.span(i)))
    return end


def _read_atom(atoms: _AtomParser, text: str, i: int, where: _Positions, items: list) -> int:
    span = where.span(i)
    token = TOKEN_RE.match(text, i).group()
    if text[i] == "'":
        raise SourceError(span, "quoted data (') is not supported")
    name = token.removeprefix(":")
    if not name:
        raise SourceError(span, "a keyword needs a name after ':'")
    if not SYMBOL_RE.fullmatch(name):
        bad = next(ch for ch in name if not SYMBOL_RE.fullmatch(ch))
        raise SourceError(span, f"invalid character {bad!r} in {token!r}")
    end, value = atoms.parse_atom(i)
    items.append(_atom(token, value, span))
    return end


def _atom(token: str, value: object, span: Span) -> Datum:
    if token.startswith(":"):
        return Keyword(token[1:], span)
    if token in ("true", "false"):
        return Boolean(token == "true", span)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not _finite(value):
            return Symbol(token, span)
        return Number(value, span, token)
    return Symbol(token, span)


def _finite(value: float) -> bool:
    return value - value == 0.0
