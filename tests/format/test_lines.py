"""sx2torch/lines.py: black's split of a long statement line, without black. Where it
answers, its answer is black's own (`format._split`, black formatting the line at its
depth); the emitted modules' long lines are all answered but those listed."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys

import pytest

from cases import SOURCES, emitted, lisp
from sx2torch import format, lines

OPTIONS = [{}, {"target": "cpu"}, {"source_lines": True}]


def _left_to_black(line: str) -> bool:
    """The long lines the splitter leaves to black: an assignment to a subscript (whose
    target's brackets black may split: not followed), and a string black re-quotes or
    unescapes (a docstring with quotes and backslashes)."""
    return re.match(r" *[\w.]+\[[^]]*\] = ", line) is not None or "\\" in line


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.stem)
def test_each_long_statement_is_split_as_black_splits_it(path):
    """On each target and with --source-lines; `_operands`' chains are its own tests'."""
    written = {}
    for options in OPTIONS:
        code = emitted(path.read_text(encoding="utf-8"), **options)
        targets = lines.Targets(code)
        assert targets.plain  # the emitter writes no feature black detects
        for line in format.long_lines(code.split("\n")):
            if format._operands(line) is None:
                written[line] = lines.split(line, targets)
    refused = [line for line, text in written.items() if text is None]
    assert all(_left_to_black(line) for line in refused), refused
    answered = tuple(line for line in written if line not in refused)
    blacks = format._split(answered) if answered else ()
    assert [written[line] for line in answered] == list(blacks)


def test_a_compile_of_bert_or_p1_does_not_import_black(tmp_path):
    """Importing black was a fifth of a small compile's start-up: the examples and the
    benchmark's P1 source have no long line the format pass leaves to black."""
    from benchmarks.transpile import attention

    p1 = tmp_path / "p1.lisp"
    p1.write_text(attention(160))
    bert = tmp_path / "bert.lisp"
    bert.write_text(lisp("bert").read_text(encoding="utf-8"))
    probe = (
        "import sys\n"
        "from sx2torch.cli import main\n"
        "for source in sys.argv[1:]:\n"
        "    assert main([source, '-o', source + '.py']) == 0\n"
        "print('black' in sys.modules)\n"
    )
    env = {**os.environ, "SX2TORCH_NO_CACHE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", probe, str(bert), str(p1)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.stdout.split() == ["False"], run.stderr


# Generated statements: calls, subscripts, tuples, lists, comprehensions, conditionals,
# keyword arguments, binary and unary operators, comparisons, attribute chains, nested
# 0-3 deep, as assignments, returns, calls and `def` lines, at depths 0-3.
NAMES = ["x", "self.weight", "torch", "hidden_states", "a", "attention_mask", "w_bf16"]
ATOMS = ["0", "1", "-1", "0.02", "1e-05", "None", "True", '"f32"', '"layers.*.mlp"']
OPERATORS = ["+", "-", "*", "/", "@", "//", "<", "==", "and", "or", "not in"]


def _name(r: random.Random) -> str:
    return r.choice(NAMES) + "".join(
        "." + r.choice(["to", "shape", "float", "t", "bias", "eps"])
        for _ in range(r.randint(0, 2))
    )


def _expression(r: random.Random, depth: int) -> str:
    kind = r.randint(0, 12 if depth > 0 else 2)
    inner = depth - 1
    if kind == 0:
        return _name(r)
    if kind == 1:
        return r.choice(ATOMS)
    if kind == 2:
        return _name(r) + r.choice(["", ".float()", ".t()", "[0]", "**2"])
    if kind in (3, 4):
        return _call(r, inner)
    if kind == 5:
        index = ", ".join(
            r.choice([":", "0", "1:2", "None"]) for _ in range(r.randint(1, 3))
        )
        return f"{_expression(r, inner)}[{index}]"
    if kind in (6, 7):
        items = [_expression(r, inner) for _ in range(r.randint(0, 4))]
        tuple_ = kind == 6 and len(items) > 1  # (black drops a lone item's parentheses)
        return f"({', '.join(items)})" if tuple_ else f"[{', '.join(items)}]"
    if kind == 8:
        return f" {r.choice(OPERATORS)} ".join(_expression(r, inner) for _ in range(2))
    if kind == 9:
        return f"({_expression(r, inner)} + {_expression(r, inner)}).t()"
    if kind == 10:
        body, orelse = _expression(r, inner), _expression(r, inner)
        return f"{body} if {_name(r)} else {orelse}"
    if kind == 11:
        return f"[{_expression(r, inner)} for _ in {_call(r, inner)}]"
    return "-" + _name(r)


def _call(r: random.Random, depth: int) -> str:
    arguments = [_expression(r, depth) for _ in range(r.randint(0, 4))]
    arguments += [
        f"{r.choice(['dim', 'dtype', 'eps', 'size'])}={_expression(r, depth)}"
        for _ in range(r.randint(0, 2))
    ]
    tail = r.choice(["", "", ".to(torch.bfloat16)", ".permute(0, 2, 1, 3)"])
    return f"{_name(r)}({', '.join(arguments)}){tail}"


def _statement(r: random.Random) -> str:
    kind, depth = r.randint(0, 5), r.randint(0, 3)
    if kind == 0:
        return "return " + _expression(r, depth)
    if kind == 1:
        return f"{_name(r)} = {_expression(r, depth)}"
    if kind == 2:
        return _call(r, depth)
    if kind == 3:
        names = ["hidden_size", "eps=1e-05", "bias=True", "std=0.02", "num_heads=8"]
        parameters = ["self"] + ["*"] * r.randint(0, 1)
        parameters += [r.choice(names) + str(i) for i in range(r.randint(1, 12))]
        return f"def f({', '.join(parameters)}):"
    if kind == 4:
        return "a, b = " + _expression(r, depth)
    return f"return {_expression(r, depth)}, {_expression(r, depth)}"


def _comment(r: random.Random) -> str:
    """--source-lines' comment, or none."""
    return f"  # m.lisp:{r.randint(1, 999)}:{r.randint(1, 99)}" * r.randint(0, 1)


def test_generated_statements_are_split_as_black_splits_them():
    """Written as black spaces them (a `**` hugs its simple operands), 2,000 of them
    around a line's length, at depths 0-3, half with a comment after them."""
    r = random.Random(39)
    statements = (_statement(r) for _ in range(20000))
    long = list(
        dict.fromkeys(
            "    " * r.randint(0, 3) + statement + _comment(r)
            for statement in statements
            if 80 < len(statement) < 140
        )
    )[:2000]
    targets = lines.Targets("\n".join(long))  # black formats them in one module
    assert targets.plain
    written = {line: lines.split(line, targets) for line in long}
    answered = tuple(line for line, text in written.items() if text is not None)
    assert len(answered) == len(long) == 2000
    assert [written[line] for line in answered] == list(format._split(answered))


def test_a_line_nested_past_pythons_stack_is_left_to_black():
    line = "y = " + "f(" * 1500 + "x" + ")" * 1500
    assert lines.split(line) is None


def test_a_trailing_comma_after_star_arguments_waits_for_the_modules_targets():
    """Black adds one only where the target versions it detects in the module allow it:
    none in a module without a feature it detects (the emitter's), some in one with an
    f-string. The splitter knows the first for certain, and leaves the rest to black."""
    parameters = ", ".join(f"argument_{i}=1" for i in range(9))
    line = f"    def __init__(self, *, {parameters}):"
    assert lines.split(line) is None
    assert lines.split(line, lines.Targets('x = f"{y}"\n' + line)) is None
    plain = lines.split(line, lines.Targets(line))
    assert plain == format._split((line,))[0] and not plain.endswith(",\n    ):")
