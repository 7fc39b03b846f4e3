"""The read pass: UTF-8 text -> a list of data, each with its line and column.

sexpdata parses the atoms and strings; the brackets, comments and positions are
walked here, iteratively, so that deep nesting cannot exhaust Python's stack and
sexpdata's quirks (``t`` as True, ``nil`` as an empty list, an unterminated
string raising AttributeError) never reach the compiler.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Union

import sexpdata

from sx2torch.errors import SourceError, Span

MAX_DEPTH = 64
WHITESPACE = (
    " \t\n\r\f\v"  # ASCII only, as sexpdata; other spaces are invalid characters
)
SYMBOL_RE = re.compile(r"[A-Za-z0-9_*+/<>=!?&.%-]+")
TOKEN_RE = re.compile(r"[^ \t\n\r\f\v()\[\]\";]+")
# Unrolled (no alternation repeated per character): re kept a backtracking entry for each
# character of a string, 150 bytes each, so an 8 MB docstring took over 1 GB to read.
STRING_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
NUMBER_RE = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
)  # else a symbol: nan, inf, 1_0
INFINITIES = ("inf", "-inf", "+inf")  # the one non-finite literal: a mask's fill
INT_RANGE = range(-(2**63), 2**63)  # what torch takes as an integer
CLOSERS = {"(": ")", "[": "]"}
BOM = "\ufeff"


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
        line = max(bisect.bisect_right(self.starts, offset) - 1, 0)  # 0-based
        return Span(line + 1, offset - self.starts[line] + 1)


def decode(data: bytes) -> str:
    """UTF-8 bytes (a leading byte-order mark dropped) -> text, or a located error at the first bad byte."""
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as error:
        good = data[: error.start].decode("utf-8").removeprefix(BOM)
        bad = data[error.start : error.end].hex(" ")
        raise SourceError(
            _Positions(good).span(len(good)),
            f"the file is not valid UTF-8 (byte {bad})",
        ) from None


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
        if c in WHITESPACE:
            i += 1
        elif c == ";":
            newline = text.find("\n", i)
            i = n if newline < 0 else newline + 1
        elif c in CLOSERS:
            if len(stack) >= MAX_DEPTH:
                raise SourceError(
                    where.span(i), f"forms nested deeper than {MAX_DEPTH} levels"
                )
            stack.append((c, i, items))
            items = []
            i += 1
        elif c in ")]":
            if not stack:
                raise SourceError(
                    where.span(i),
                    f"unexpected '{c}': there is no open bracket to close",
                )
            opener, start, outer = stack.pop()
            if CLOSERS[opener] != c:
                expected = CLOSERS[opener]
                raise SourceError(
                    where.span(i),
                    f"expected '{expected}' to close the '{opener}' at {_at(where.span(start))}, got '{c}'",
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
        raise SourceError(
            where.span(start),
            f"'{opener}' is never closed: expected '{CLOSERS[opener]}' before the end of the file",
        )
    return top


def _at(span: Span) -> str:
    return f"line {span.line}, column {span.col}"


def _read_string(
    atoms: _AtomParser, text: str, i: int, where: _Positions, items: list
) -> int:
    if not STRING_RE.match(text, i):
        raise SourceError(
            where.span(i),
            "unterminated string: expected a closing '\"' before the end of the file",
        )
    end, value = atoms.parse_str(i)
    items.append(String(value, where.span(i)))
    return end


def _read_atom(
    atoms: _AtomParser, text: str, i: int, where: _Positions, items: list
) -> int:
    span = where.span(i)
    token = TOKEN_RE.match(text, i).group()
    if text[i] == "'":
        raise SourceError(span, "quoted data (') is not supported")
    name = token.removeprefix(":")
    if not name:
        raise SourceError(span, "a keyword needs a name after ':'")
    if not SYMBOL_RE.fullmatch(name):
        at = next(
            k
            for k, ch in enumerate(token)
            if k >= len(token) - len(name) and not SYMBOL_RE.fullmatch(ch)
        )
        raise SourceError(
            where.span(i + at),
            f"invalid character {token[at]!r}: expected a name (letters, digits and -_*+/<>=!?&.%), a bracket or a space",
        )
    items.append(_atom(token, atoms, span))
    return i + len(token)


def _atom(token: str, atoms: _AtomParser, span: Span) -> Datum:
    if token.startswith(":"):
        return Keyword(token[1:], span)
    if token in ("true", "false"):
        return Boolean(token == "true", span)
    if token in INFINITIES:
        return Number(float(token), span, token)
    if not NUMBER_RE.fullmatch(token):
        return Symbol(token, span)
    # sexpdata converts a number's token (only a number's: a symbol is its token); the
    # token's end is ours, as sexpdata ends atoms only at ASCII spaces.
    value = atoms.atom(token)
    if not _finite(value) or (isinstance(value, int) and value not in INT_RANGE):
        raise SourceError(span, f"number out of range: {_short(token)}")
    return Number(value, span, token)


def _short(token: str) -> str:
    return token if len(token) <= 40 else token[:37] + "..."


def _finite(value: float) -> bool:
    return value - value == 0.0


def shown(datum: Datum) -> str:
    """A datum as a diagnostic names it: `:fp16`, `'x'`, `1.5`, `a list`."""
    if isinstance(datum, Keyword):
        return ":" + _short(datum.name)
    if isinstance(datum, Symbol):
        return f"'{_short(datum.name)}'"
    if isinstance(datum, Number):
        return _short(datum.text or repr(datum.value))
    if isinstance(datum, Boolean):
        return "true" if datum.value else "false"
    return {String: "a string", List: "a list", Vector: "a vector"}[type(datum)]
