"""A number a sub-model reads as an integer (a slice bound, a size) is checked at every
instance's arguments, not only at the key's default: a float passed there is a located
error when the file compiles, where the module would fail when it runs with `slice indices
must be integers`. A float the sub-model reads only as a number still compiles."""

from __future__ import annotations

import pytest
import torch

from conftest import load_module
from driver.test_diagnostics import compile_file
from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError

HEAD = """(defconst width {width})
(defmodel head (&key (n 8))
  (defun forward (x) (slice x :axis 1 :end n)))
(defparam h (head :n width))
(defun forward (x) (h x))
"""

# the float reaches the slice through a const of the sub-model and a stack of another
NESTED = """(defconst width 24.0)
(defmodel head (&key (n 8))
  (defconst m (* n 2))
  (defun forward (x) (slice x :axis 1 :end m)))
(defmodel mid (&key (k 3))
  (defparam hs (stack 2 (head :n k)))
  (defun forward (x) (chain hs x)))
(defparam h (mid :k width))
(defun forward (x) (h x))
"""

SIZE = """(defmodel proj (&key (d 4))
  (defparam w (zeros [d 3]))
  (defun forward (x) (matmul x w)))
(defparam p (proj :d 2.5))
(defun forward (x) (p x))
"""


@pytest.mark.parametrize(
    "source, line, col, message",
    [
        (
            HEAD.format(width="24.0"),
            4,
            19,
            "head's :n must be an integer, got 24.0: head reads it in :end "
            "(line 3, column 44)",
        ),
        (
            NESTED,
            8,
            18,
            "mid's :k must be an integer, got 24.0: head reads a number made from it "
            "in :end (line 4, column 44), 48.0 here",
        ),
        (  # resolve's check of the instance, before trace's
            SIZE,
            4,
            13,
            "building 'proj' with these arguments: parameter 'w' has a size 2.5, not a "
            "non-negative integer",
        ),
    ],
)
def test_a_float_where_an_instance_reads_an_integer_is_located(
    tmp_path, capsys, source, line, col, message
):
    rc, out, err, path = compile_file(tmp_path, capsys, source.encode())
    assert (rc, out) == (1, "")
    assert err.splitlines()[0] == f"{path}:{line}:{col}: error: {message}"


def test_an_integer_there_compiles_and_runs():
    module = load_module(compile_source(HEAD.format(width="24"), "model.lisp"))
    x = torch.arange(60.0).reshape(2, 30)
    assert torch.equal(module.Model()(x), x[:, :24])


def test_a_float_read_as_a_number_compiles():
    source = """(defmodel scale (&key (k 2))
  (defun forward (x) (* x k)))
(defparam s (scale :k 0.5))
(defun forward (x) (s x))
"""
    module = load_module(compile_source(source, "model.lisp"))
    assert torch.equal(module.Model()(torch.ones(3)), torch.full((3,), 0.5))


def test_a_size_is_a_slice_bound_and_a_compile_time_one_is_named_as_what_it_is(
    tmp_path, capsys
):
    """A size known when the module runs serves where torch takes an int (issue 35); where
    only a number known when the file compiles can serve (a call's &key), it is named.
    """
    source = "(defun forward (x y)\n  (slice x :axis 1 :end (- (size y :axis 1) 1)))\n"
    module = load_module(compile_source(source, "model.lisp"))
    x, y = torch.randn(2, 9), torch.randn(2, 5)
    assert torch.equal(module.Model()(x, y), x[:, : y.shape[1] - 1])
    source = (
        b"(defun f (x &key (k 1)) (* x k))\n"
        b"(defun forward (x y)\n  (f x :k (size y :axis 1)))\n"
    )
    rc, _, err, path = compile_file(tmp_path, capsys, source)
    assert rc == 1
    assert err.splitlines()[0] == (
        f"{path}:3:11: error: expected a number known at compile time, got (size ...), "
        "a Python integer known only when the module runs (it may be a "
        "slice's bound, a reshape's size, a pad's width, arange's bounds: where torch "
        "takes an int)"
    )


def test_an_argument_that_makes_no_number_is_a_diagnostic_at_the_instance():
    """A zero passed to a key a const divides by makes no number: resolve's check of the
    instance names the const's arithmetic, where torch would fail when the module is built.
    """
    source = """(defmodel attn (&key (dim 8) (heads 2))
  (defconst hd (// dim heads))
  (defun forward (x) (reshape x [0 0 -1 hd])))
(defparam a (attn :heads 0))
(defun forward (x) (a x))
"""
    with pytest.raises(SourceError) as caught:
        compile_source(source, "model.lisp")
    assert (caught.value.span.line, caught.value.span.col) == (4, 13)
    assert caught.value.message == (
        "building 'attn' with these arguments: (dim // heads) cannot be computed "
        "(integer division or modulo by zero)"
    )
