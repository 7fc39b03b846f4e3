"""The reader: data with positions, sexpdata's quirks kept out, located errors."""

from __future__ import annotations

import pytest

from sx2torch.syntax import read
from sx2torch.errors import SourceError, Span
from sx2torch.syntax.read import Boolean, Keyword, List, Number, String, Symbol, Vector


def one(text: str):
    (datum,) = read.run(text)
    return datum


def error(text: str) -> tuple:
    with pytest.raises(SourceError) as caught:
        read.run(text)
    return caught.value.span.line, caught.value.span.col, caught.value.message


def test_positions():
    form = one('; a comment\n(defun  f (x)\n  [1 :k "s"])')
    assert form.span == Span(2, 1)
    head, name, args, body = form.items
    assert (head, name) == (Symbol("defun", Span(2, 2)), Symbol("f", Span(2, 9)))
    assert args == List((Symbol("x", Span(2, 12)),), Span(2, 11))
    assert body == Vector(
        (Number(1, Span(3, 4), "1"), Keyword("k", Span(3, 6)), String("s", Span(3, 9))),
        Span(3, 3),
    )


def test_positions_after_a_multiline_string_and_crlf():
    a, b, c = read.run('"one\ntwo" x\r\n  y')
    assert (a.value, a.span, b, c) == (
        "one\ntwo",
        Span(1, 1),
        Symbol("x", Span(2, 6)),
        Symbol("y", Span(3, 3)),
    )


def test_t_and_nil_are_symbols_true_and_false_booleans():
    assert [type(d) for d in read.run("t nil true false")] == [
        Symbol,
        Symbol,
        Boolean,
        Boolean,
    ]
    assert [d.value for d in read.run("true false")] == [True, False]


@pytest.mark.parametrize(
    "text, value",
    [
        ("-3", -3),
        ("0", 0),
        ("+5", 5),
        ("1e-6", 1e-6),
        ("0.02", 0.02),
        ("-2.5", -2.5),
        (".5", 0.5),
        ("2.", 2.0),
    ],
)
def test_numbers(text, value):
    datum = one(text)
    assert (
        isinstance(datum, Number)
        and datum.value == value
        and type(datum.value) is type(value)
    )
    assert datum.text == text


@pytest.mark.parametrize(
    "text", ["nan", "Infinity", "1_000", "1e", "-", "+", "...", "1+"]
)
def test_not_numbers_are_symbols(text):
    assert one(text) == Symbol(text, Span(1, 1))


@pytest.mark.parametrize("text", ["inf", "-inf", "+inf"])
def test_infinities_are_numbers(text):
    datum = one(text)
    assert (
        isinstance(datum, Number) and datum.value == float(text) and datum.text == text
    )


@pytest.mark.parametrize(
    "text",
    ["1e999", "-1e400", "9223372036854775808", "-9223372036854775809", "9" * 5000],
)
def test_numbers_out_of_range(text):
    line, col, message = error(f"(f {text})")
    assert (line, col) == (1, 4) and message.startswith("number out of range: ")


def test_64_bit_integers_are_in_range():
    assert [d.value for d in read.run("9223372036854775807 -9223372036854775808")] == [
        2**63 - 1,
        -(2**63),
    ]


def test_symbol_characters():
    names = "rms-norm &key sexpgpu/nn a*+/<>=!?&.%-_Z9 x_y x-y"
    assert [d.name for d in read.run(names)] == names.split()


def test_keywords():
    assert read.run(":precision :f32 :1") == [
        Keyword("precision", Span(1, 1)),
        Keyword("f32", Span(1, 12)),
        Keyword("1", Span(1, 17)),
    ]


def test_strings_with_escapes():
    assert (
        one(r'"a \"quoted\" word and a \\ backslash"').value
        == 'a "quoted" word and a \\ backslash'
    )


def test_comments_end_at_the_newline_or_the_file():
    assert read.run("x ; (not read\n y ; end") == [
        Symbol("x", Span(1, 1)),
        Symbol("y", Span(2, 2)),
    ]


def test_a_comment_may_hold_any_text():
    assert read.run(';; "unbalanced ( [ \u2028 \x00\nx') == [Symbol("x", Span(2, 1))]


@pytest.mark.parametrize(
    "text, line, col, message",
    [
        ("(a (b)", 1, 1, "'(' is never closed: expected ')' before the end of the file"),
        ("(a\n [b", 2, 2, "'[' is never closed: expected ']' before the end of the file"),
        ("a)", 1, 2, "unexpected ')': there is no open bracket to close"),
        ("(a]", 1, 3, "expected ')' to close the '(' at line 1, column 1, got ']'"),
        ('(a "b)', 1, 4, "unterminated string: expected a closing '\"' before the end of the file"),
        ('"ends in a backslash\\"', 1, 1, "unterminated string: expected a closing '\"' before the end of the file"),
        ("'(a)", 1, 1, "quoted data (') is not supported"),
        ("(a : b)", 1, 4, "a keyword needs a name after ':'"),
        ("(ab,c)", 1, 4, "invalid character ',': expected a name (letters, digits and -_*+/<>=!?&.%), a bracket or a space"),
        ("::k", 1, 2, "invalid character ':': expected a name (letters, digits and -_*+/<>=!?&.%), a bracket or a space"),
        ("caf\u00e9", 1, 4, "invalid character 'é': expected a name (letters, digits and -_*+/<>=!?&.%), a bracket or a space"),
        ("a\u2028b", 1, 2, "invalid character '\\u2028': expected a name (letters, digits and -_*+/<>=!?&.%), a bracket or a space"),
        ("\u00a0", 1, 1, "invalid character '\\xa0': expected a name (letters, digits and -_*+/<>=!?&.%), a bracket or a space"),
        ("a`b", 1, 2, "invalid character '`': expected a name (letters, digits and -_*+/<>=!?&.%), a bracket or a space"),
    ],
)  # fmt: skip
def test_errors(text, line, col, message):
    assert error(text) == (line, col, message)


def test_nesting_is_bounded():
    assert read.run("(" * 64 + ")" * 64)
    assert error("(" * 65 + ")" * 65) == (1, 65, "forms nested deeper than 64 levels")
    assert error("[(" * 10_000)[:2] == (1, 65)


def test_decode():
    assert read.decode(b"\xef\xbb\xbf(x)") == "(x)"
    assert read.decode("(é)".encode()) == "(é)"
    with pytest.raises(SourceError) as caught:
        read.decode(b"(a\n  b\xc3(")
    assert (caught.value.span, caught.value.message) == (
        Span(2, 4),
        "the file is not valid UTF-8 (byte c3)",
    )


def test_shown():
    a, b, c, d, e, f, g = read.run(':k x 1.50 true "s" (l) [v]')
    assert [read.shown(x) for x in (a, b, c, d, e, f, g)] == [
        ":k",
        "'x'",
        "1.50",
        "true",
        "a string",
        "a list",
        "a vector",
    ]


def test_sexpdata_converts_only_numbers(monkeypatch):
    """A symbol or keyword is its token: only a number's is converted by sexpdata (every
    atom's was, a third of the reader's time on a long expression)."""
    converted: list = []
    atom = read._AtomParser.atom

    def counted(self, token):
        converted.append(token)
        return atom(self, token)

    monkeypatch.setattr(read._AtomParser, "atom", counted)
    datum = one("(+ x :k 2.0 -3 true y)")
    assert converted == ["2.0", "-3"]
    assert [type(d) for d in datum.items] == [
        Symbol,
        Symbol,
        Keyword,
        Number,
        Number,
        Boolean,
        Symbol,
    ]
    assert [d.value for d in datum.items[3:5]] == [2.0, -3]
