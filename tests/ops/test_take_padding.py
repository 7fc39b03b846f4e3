"""`(take table ids :padding-idx P)` is torch's `F.embedding(ids, table, padding_idx=P)`:
the rows of `table[ids]`, and torch's embedding backward, which leaves row P's gradient
zero (a padding token trains nothing). Against torch's own nn.Embedding of that
padding_idx: the gradient of a loss through the generated module (f32 and bf16, the cuda
target and the held cpu target), a `(gradient ...)` form's rule and the interpreter's; a P
that cannot be a row is a located diagnostic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import load_module, refused_alike
from sx2torch import interpret
from sx2torch.compiler import Options, compile_source

IDS = torch.tensor([[1, 7, 1], [9, 0, 1]])  # row 1 three times, row 9 (-1) once


def source(row: int) -> str:
    return (
        "(defparam table (normal [10 4]))\n"
        "(defparam w (normal [4]))\n"
        f"(defun forward (ids) (take table ids :padding-idx {row}))\n"
        f"(defun loss (ids) (sum (cast (* (take table ids :padding-idx {row}) w) :f32)))\n"
        "(defun grad (ids)\n"
        f"  (gradient (sum (* (take table ids :padding-idx {row}) w)) table))\n"
        "(defrun exact :precision :f32)\n(defrun train :precision :bf16)\n"
    )


def built(row: int, run: str, target: str = "cuda"):
    code = compile_source(source(row), "model.lisp", Options(run=run, target=target))
    torch.manual_seed(0)
    return load_module(code).Model(), code


def reference(model, row: int) -> nn.Embedding:
    embedding = nn.Embedding(10, 4, padding_idx=row)
    with torch.no_grad():
        embedding.weight.copy_(model.table)
    return embedding


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("run", ["exact", "train"])
@pytest.mark.parametrize("row", [1, -1])
def test_the_pad_rows_gradient_is_zero_as_torchs_embedding_gives_it(row, run, target):
    model, code = built(row, run, target)
    assert f"F.embedding(ids, self.table, padding_idx={row})" in code
    model.loss(IDS).backward()
    embedding = reference(model, row)
    rows = embedding(IDS)
    w = model.w.detach()
    if run == "train":  # the rows and w rounded to bf16, their product rounded once
        rows, w = rows.bfloat16().float(), w.bfloat16().float()
        (rows * w).bfloat16().float().sum().backward()
    else:
        (rows * w).sum().backward()
    got, want = model.table.grad, embedding.weight.grad
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want)
    assert torch.equal(got[row], torch.zeros(4))
    assert got[7].abs().min() > 0 and got[0].abs().min() > 0  # the other rows train


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("row", [1, -1])
def test_a_gradient_forms_rule_zeroes_the_pad_row_as_torchs_backward(row, target):
    model, code = built(row, "exact", target)
    assert "sx.take_backward(" in code and f"padding_idx={row})" in code
    embedding = reference(model, row)
    (embedding(IDS) * model.w.detach()).sum().backward()
    with torch.no_grad():
        got = model.grad(IDS)
    assert torch.equal(got, embedding.weight.grad)
    assert torch.equal(got[row], torch.zeros(4))


@pytest.mark.parametrize("row", [1, -1])
def test_the_interpreter_gives_torchs_rows_and_gradients(row):
    model, _ = built(row, "exact")
    interpreted = interpret.load(source(row), run="exact", state=model.state_dict())
    embedding = reference(model, row)
    (embedding(IDS) * model.w.detach()).sum().backward()
    with torch.no_grad():
        assert torch.equal(interpreted.evaluate("forward", [IDS]), embedding(IDS))
        assert torch.equal(interpreted.evaluate("grad", [IDS]), embedding.weight.grad)


def test_a_rows_default_of_none_is_torchs_padding_idx_none():
    """A model's &key may default to `none`: the constructor's `padding_idx=None`, which
    F.embedding takes as no padding row; an instance passes a row or none."""
    text = (
        "(defmodel lookup (&key (rows 10) (pad none))\n"
        "  (defparam table (normal [rows 4] :padding-idx pad))\n"
        "  (defun forward (ids) (take table ids :padding-idx pad)))\n"
        "(defparam plain (lookup))\n(defparam padded (lookup :pad 1))\n"
        "(defparam given (lookup :pad none))\n"
        "(defun forward (ids) (+ (plain ids) (padded ids) (given ids)))\n"
    )
    code = compile_source(text, "model.lisp")
    assert "def __init__(self, *, rows=10, pad=None):" in code
    assert (
        "        if pad is not None:\n"
        "            with torch.no_grad():\n"
        "                self.table[pad].fill_(0)\n"
    ) in code
    assert "F.embedding(ids, self.table, padding_idx=self.pad)" in code
    torch.manual_seed(0)
    model = load_module(code).Model()
    assert model.plain.table[1].abs().min() > 0
    assert torch.equal(model.padded.table[1], torch.zeros(4))
    (model.plain(IDS) + model.padded(IDS)).sum().backward()
    assert model.plain.table.grad[1].abs().min() > 0
    assert torch.equal(model.padded.table.grad[1], torch.zeros(4))


TABLE = "(defparam table (normal [8 4]))\n"


@pytest.mark.parametrize(
    "text, line_col, message",
    [
        (
            TABLE + "(defun forward (ids) (take table ids :padding-idx 8))\n",
            "2:22",
            ":padding-idx 8 is out of range for 8 rows (from -8 to 7)",
        ),
        (
            TABLE + "(defun forward (ids) (take table ids :padding-idx -9))\n",
            "2:22",
            ":padding-idx -9 is out of range for 8 rows (from -8 to 7)",
        ),
        (
            "(defparam table (normal [8]))\n"
            "(defun forward (ids) (take table ids :padding-idx 0))\n",
            "2:22",
            "take with :padding-idx reads a table of rows, [rows width], as torch's "
            "embedding does: got [8]",
        ),
        (
            TABLE + "(defun forward (ids) (take table ids :padding-idx 1.5))\n",
            "2:51",
            ":padding-idx must be an integer, got 1.5",
        ),
        (
            "(defparam table (normal [8 4] :padding-idx 8))\n"
            "(defun forward (ids) (take table ids))\n",
            "1:44",
            ":padding-idx 8 is out of range for 8 rows (from -8 to 7)",
        ),
        (
            "(defconst rows 8)\n(defparam table (normal [rows 4] :padding-idx -9))\n"
            "(defun forward (ids) (take table ids))\n",
            "2:11",
            "parameter 'table': :padding-idx -9 is out of range for 8 rows (from -8 to 7)",
        ),
        (
            "(defparam e (Embedding 10 4 :padding-idx 10))\n(defun forward (x) (e x))\n",
            "1:13",
            "parameter 'weight': :padding-idx 10 is out of range for 10 rows",
        ),
        (
            "(defparam e (Embedding 10 4 :padding-idx 0.5))\n(defun forward (x) (e x))\n",
            "1:29",
            "Embedding's :padding-idx (a row, or none) must be an integer, got 0.5",
        ),
        (
            "(defmodel lookup (&key (pad none))\n"
            "  (defparam table (normal [4 4] :padding-idx pad))\n"
            "  (defun forward (x) x))\n"
            "(defparam layers (stack (i 6) (lookup :pad (- i 5))))\n"
            "(defun forward (x) (chain layers x))\n",
            "4:31",
            "parameter 'table': :padding-idx -5 is out of range for 4 rows",
        ),
        (
            "(defmodel lookup (&key (pad none))\n"
            "  (defparam table (normal [] :padding-idx pad))\n"
            "  (defun forward (x) x))\n"
            "(defparam one (lookup :pad 0))\n(defun forward (x) (one x))\n",
            "4:15",
            "parameter 'table' has :padding-idx 0, but no rows",
        ),
        (
            "(defconst pad none)\n(defparam w (normal [4 4] :std pad))\n"
            "(defun forward (x) x)\n",
            "2:32",
            "this number is none (a &key whose default is none)",
        ),
        (
            "(defparam e (Linear 4 4 :bias none))\n(defun forward (x) (e x))\n",
            "1:25",
            "Linear's :bias takes a number, not none",
        ),
        (
            "(defconst pad none)\n"
            + TABLE
            + "(defun forward (ids) (* (take table ids) pad))\n",
            "3:42",
            "this number is none (a &key whose default is none)",
        ),
        (
            "(defconst pad none)\n"
            + TABLE
            + "(defun forward (ids) (if pad ids ids))\n",
            "3:26",
            "this number is none (a &key whose default is none)",
        ),
        (
            TABLE + "(defun forward (ids)\n"
            "  (gradient (sum (gradient (sum (square (take table ids :padding-idx 0)))\n"
            "                           table))\n"
            "            table))\n",
            "3:41",
            "a second derivative through take with :padding-idx is not supported yet",
        ),
    ],
)
def test_a_padding_row_that_cannot_be_one_is_a_located_diagnostic(
    text, line_col, message
):
    error = refused_alike(text)
    assert message in error.message
    assert f"{error.span.line}:{error.span.col}" == line_col
