"""Hostile inputs that once ran without end or misreported: bounded constant folding, size
limits, -o onto its own source, terminal-safe file names, an atomic --html, one rule for
lines, and state_dict keys that no const renames."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from sx2torch import cli, resolve
from sx2torch.limits import MAX_ELEMENTS, MAX_LAYERS
from sx2torch.resolve import models
from sx2torch.errors import SourceError
from sx2torch.syntax import read
from sx2torch.compiler import compile_source
from sx2torch.emit import naming
from sx2torch.syntax import scalars
from sx2torch.syntax.program import Model
from sx2torch.syntax.scalars import ScalarOp
from sx2torch.errors import source_lines
from sx2torch.tools import explain

FORWARD = "(defun forward (x) (* x n))\n"


def run(capsys, *argv) -> tuple:
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "consts, column",
    [
        ("(defconst n (** 3 9223372036854775807))\n", 13),
        ("(defconst a (** 2 62))\n(defconst n (** a a))\n", 13),
        ("(defconst n (** -7 (** 2 40)))\n", 13),
    ],
)
def test_a_huge_power_is_refused_before_it_is_computed(
    capsys, monkeypatch, tmp_path, consts, column
):
    path = tmp_path / "p.lisp"
    path.write_text(consts + FORWARD)
    computed = []  # every power folded, as (base, exponent)
    power = scalars.BINARY[ScalarOp.POW]

    def recorded(base, exponent):
        computed.append((base, exponent))
        # one past 64 bits is not computed here either, so that the test fails, not hangs
        return power(base, exponent) if abs(base) <= 1 or exponent <= 64 else 0

    monkeypatch.setitem(scalars.BINARY, ScalarOp.POW, recorded)
    for command in ([], ["explain"]):
        rc, out, err = run(capsys, *command, path)
        line = consts.count("\n")
        assert (rc, out) == (1, "")
        assert err.startswith(
            f"{path}:{line}:{column}: error: number out of range (with the consts at their defaults)\n"
        )
    # refused from its operands' sizes: no power past 64 bits was computed (one would take
    # memory and time without end)
    assert all(abs(b) <= 1 or e <= 64 for b, e in computed)


def test_powers_within_64_bits_still_fold(build):
    source = "(defconst n (** 2 62))\n(defconst m (** -2 63))\n(defconst k (** 1 (** 2 62)))\n"
    module, code = build(source + "(defun forward (x) (+ x n m k))\n")
    model = module.Model()
    assert (model.n, model.m, model.k) == (2**62, -(2**63), 1)


def test_a_stack_past_the_limit_is_located(capsys, tmp_path):
    path = tmp_path / "s.lisp"
    path.write_text(
        "(defmodel b () (defparam w (normal [4 4])) (defun forward (x) (matmul x w)))\n"
        "(defparam blocks (stack 100000000000 (b)))\n"
        "(defun forward (x) (chain blocks x))\n"
    )
    rc, out, err = run(capsys, path)
    assert (rc, out) == (1, "")
    assert err.splitlines()[0] == (
        f"{path}:2:18: error: a stack has at most {MAX_LAYERS:,} layers, got 100,000,000,000"
    )


def test_a_stack_built_past_the_limit_is_refused_at_its_defparam(tmp_path):
    """A count from a const is checked again when the module is built with another one: a
    ValueError at once (10**11 layers once took memory until the process was killed), which
    the runtime locates at the stack's defparam."""
    import sx2torch
    from sx2torch import runtime as sx
    from sx2torch.runtime import located

    path = tmp_path / "deep.lisp"
    path.write_text(
        "(defconst n-layer 2)\n"
        "(defmodel b () (defparam w (normal [4 4])) (defun forward (x) (matmul x w)))\n"
        "(defparam blocks (stack n-layer (b)))\n"
        "(defun forward (x) (chain blocks x))\n"
    )
    deep = sx2torch.load(path).Deep
    assert len(deep(n_layer=3).blocks) == 3
    assert sx.layers(MAX_LAYERS) == range(MAX_LAYERS)
    with pytest.raises(ValueError) as error:
        deep(n_layer=MAX_LAYERS + 1)
    assert str(error.value) == (
        f"a stack has at most {MAX_LAYERS:,} layers, got {MAX_LAYERS + 1:,}"
    )
    where = located.locate(error.value)[0].splitlines()
    assert where[0].startswith(f"{path}:3:11: note: the error is raised in this form")
    assert where[1] == "  (defparam blocks (stack n-layer (b)))"


@pytest.mark.parametrize(
    "init, elements",
    [("(normal [100000000000 100000000000])", 10**22), ("(eye 300000)", 9 * 10**10)],
)
def test_a_parameter_past_the_limit_is_located(capsys, tmp_path, init, elements):
    path = tmp_path / "w.lisp"
    path.write_text(f"(defparam w {init})\n(defun forward (x) (matmul x w))\n")
    rc, out, err = run(capsys, path)
    assert (rc, out) == (1, "")
    assert err.splitlines()[0] == (
        f"{path}:1:13: error: a parameter has at most {MAX_ELEMENTS:,} elements, got {elements:,}"
    )


def test_o_refuses_to_overwrite_its_own_source(capsys, tmp_path):
    path = tmp_path / "self.lisp"
    path.write_text("(defparam w (zeros [2 2]))\n(defun forward (x) (matmul x w))\n")
    before = path.read_bytes()
    link = tmp_path / "link.lisp"
    link.symlink_to(path)
    for out in (path, link):
        rc, stdout, err = run(capsys, path, "-o", out)
        assert (rc, stdout) == (2, "")
        assert (
            err == f"sx2torch: error: -o {out}: that is the source file; name another\n"
        )
    rc, _, err = run(capsys, "explain", path, "--html", path)
    assert rc == 2 and "--html" in err
    assert path.read_bytes() == before


def test_file_names_are_terminal_safe_in_every_message(capsys, tmp_path):
    path = tmp_path / "bad\x1b[31m.lisp"
    path.write_text("(defun forward (x)\n  (relu y))\n")
    rc, _, err = run(capsys, path)
    assert rc == 1 and "\x1b" not in err
    assert err.startswith(f"{str(tmp_path)}/bad\\x1b[31m.lisp:2:9: error: ")
    rc, _, err = run(capsys, tmp_path / "missing\x1b].lisp")
    assert rc == 2 and "\x1b" not in err and "missing\\x1b].lisp" in err
    path.write_text("(defun forward (x) (relu x))\n")
    rc, _, err = run(capsys, "check", path)
    assert rc == 1 and "\x1b" not in err and "bad\\x1b[31m.py does not exist" in err
    rc, out, _ = run(capsys, "explain", path)
    assert rc == 0 and "\x1b" not in out


def test_explain_html_is_replaced_atomically(capsys, tmp_path, monkeypatch):
    source = tmp_path / "m.lisp"
    source.write_text("(defparam w (zeros [2 2]))\n(defun forward (x) (matmul x w))\n")
    page = tmp_path / "report.html"
    page.write_text("old page")

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", full_disk)
    rc, _, err = run(capsys, "explain", source, "--html", page)
    assert (
        rc == 2
        and err == f"sx2torch: error: cannot write {page}: No space left on device\n"
    )
    assert page.read_text() == "old page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.lisp", "report.html"]
    monkeypatch.undo()
    assert run(capsys, "explain", source, "--html", page)[0] == 0
    assert page.read_text().startswith("<!doctype html>")


@pytest.mark.parametrize(
    "separator", ["\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
)
def test_reports_count_lines_as_the_reader_does(separator):
    text = (
        f";; a comment with a {separator} inside\n"
        "(defparam w (normal [4 4]))\n"
        "(defun forward (x)\n"
        "  (with-numerics (:sensitivity :high) (exp (matmul x w))))\n"
        "(defrun train :precision :bf16)\n"
    )
    assert len(source_lines(text)) == 5
    report = explain.run(text, "m.lisp")
    assert [line["line"] for line in report["lines"]] == [4]
    assert report["lines"][0]["source"].startswith("(with-numerics")
    from sx2torch.tools import report as page

    html = page.render(report, text)
    marked = html.split('id="L4"')[1].split("</div>")[0]
    assert "island" in marked and "with-numerics" in marked
    assert 'id="L6"' not in html


def test_a_const_never_renames_a_parameter_key(build):
    module, code = build(
        "(defconst a-b 4)\n(defparam a_b (normal [a-b a-b]))\n(defun forward (x) (matmul x a_b))\n"
    )
    assert list(module.Model().state_dict()) == ["a_b"]
    assert list(module.Model(a_b_2=3).state_dict()["a_b"].shape) == [3, 3]


def test_no_traceback_from_a_huge_power_in_a_subprocess(tmp_path):
    path = tmp_path / "p.lisp"
    path.write_text("(defconst n (** 3 9223372036854775807))\n" + FORWARD)
    done = subprocess.run(
        [sys.executable, "-m", "sx2torch", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr


def test_a_wide_sum_compiles_to_code_linear_in_its_size():
    def compiled(n: int) -> str:
        operands = " ".join(["x"] * n)
        source = f"(defparam w (normal [4 4]))\n(defun forward (x) (matmul (+ {operands}) w))\n"
        return compile_source(source, "wide.lisp")

    small, large = compiled(500), compiled(2000)
    assert len(large) < 4.4 * len(small)
    names = re.findall(r"^\s+(\w+) = ", large, flags=re.M)
    assert max(map(len, names)) <= naming.MAX_DERIVED


def test_many_consts_never_list_the_names_they_could_have_meant(monkeypatch):
    """The known names are made only for an undefined name's diagnostic: made for every const
    read, they made a file of n consts take time as n squared."""

    def listed(model):
        raise AssertionError("names listed without an error")

    monkeypatch.setattr(Model, "names", listed)
    consts = "".join(f"(defconst c{i} (+ c{i - 1} 1))\n" for i in range(1, 300))
    source = "(defconst c0 0)\n" + consts + "(defun forward (x) (* x c299))\n"
    assert "self.c299 = c299\n" in compile_source(source, "consts.lisp")


def test_a_huge_docstring_is_read_in_memory_linear_in_it():
    """Reading it took 150 bytes per character (re's backtracking); now about one."""
    import tracemalloc

    from sx2torch.syntax import read

    text = '(defun forward (x)\n  "' + "ab" * (1 << 20) + '\\"c"\n  (relu x))\n'
    tracemalloc.start()
    try:
        (defun,) = read.run(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert defun.items[3].value == "ab" * (1 << 20) + '"c'
    assert peak < 8 * len(text)


def test_many_parameters_are_resolved_in_work_linear_in_their_number(monkeypatch):
    """Each parameter's state_dict key was compared with every other's, spelled again each
    time: n parameters took n squared spellings (2,000 took 2 million)."""
    spelled = []

    def counted(name):
        spelled.append(name)
        return spell(name)

    spell = models.mangle
    monkeypatch.setattr(models, "mangle", counted)
    params = "".join(f"(defparam w{i} (normal [2]))\n" for i in range(400))
    program = resolve.run(read.run(params + "(defun forward (x) x)\n"), "many")
    assert len(program.top.params) == 400 and len(spelled) <= 400
    with pytest.raises(SourceError, match="'a-b' and 'a_b' \\(line 1\\) would both"):
        resolve.run(
            read.run(
                "(defparam a_b (ones [1]))\n(defparam a-b (ones [1]))\n(defun forward (x) x)\n"
            ),
            "m",
        )
