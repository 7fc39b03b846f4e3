"""The call graph, read from the traced graphs: recursion and depth, with and without
`gradient` (which traces calls in place)."""

from __future__ import annotations

import pytest

import sx2torch.trace.calls as calls
from sx2torch import resolve, trace
from sx2torch.syntax import read
from sx2torch.errors import SourceError
from sx2torch.ir import Kind


def traced(text: str) -> dict:
    return trace.run(resolve.run(read.run(text), "net"))


def error(text: str) -> tuple:
    with pytest.raises(SourceError) as caught:
        traced(text)
    return caught.value.span.line, caught.value.span.col, caught.value.message


def chain(n: int, call: str = "(f{next} x)") -> str:
    calls = "".join(
        f"(defun f{i} (x) (relu {call.format(next=i + 1)}))\n" for i in range(n - 1)
    )
    return calls + f"(defun f{n - 1} (x) (sum x))\n(defun forward (x) (f0 x))\n"


def test_calls_nest_at_most_64_deep():
    defuns = {"forward", *(f"f{i}" for i in range(63))}  # forward, f0 ... f62: 64 deep
    assert set(traced(chain(63))) == {("net", name) for name in defuns}
    assert error(chain(64)) == (65, 21, "calls nested more than 64 defuns deep")


def test_the_depth_is_bounded_where_gradient_traces_calls_in_place():
    source = chain(70) + "(defun g (x) (gradient (f0 x) x))\n"
    assert error(source)[2] == "calls nested more than 64 defuns deep"


def test_sub_model_calls_count_toward_the_depth():
    models = "(defmodel m0 () (defun forward (x) (relu x)))\n"
    for i in range(1, 70):
        models += f"(defmodel m{i} () (defparam inner (m{i - 1})) (defun forward (x) (inner x)))\n"
    line, col, message = error(
        models + "(defparam outer (m69))\n(defun forward (x) (outer x))\n"
    )
    assert message == "calls nested more than 64 defuns deep"


def test_recursion_is_found_in_the_traced_calls():
    assert error("(defun ping (x) (pong x))\n(defun pong (x) (ping x))\n(defun forward (x) (ping x))") == (
        2, 18, "defun 'ping' calls itself (ping -> pong -> ping); recursion is not supported"
    )  # fmt: skip


def test_recursion_under_gradient_stops_before_it_loops():
    source = "(defun f (x) (sum (exp (f x))))\n(defun forward (x) (gradient (f x) x))"
    assert error(source) == (
        1, 25, "defun 'f' calls itself (f -> f); recursion is not supported"
    )  # fmt: skip


def test_a_let_binding_named_as_a_defun_is_not_a_call():
    graphs = traced("(defun f (x) (let ((f (relu x))) f))\n(defun forward (x) (f x))")
    assert [(n.kind, n.what) for n in graphs["net", "f"].nodes] == [(Kind.OP, "relu")]
    (call,) = graphs["net", "forward"].nodes
    assert (call.kind, call.attrs["target"]) == (Kind.CALL, "f")


def test_many_paths_through_the_call_graph_are_walked_per_defun_not_per_path(monkeypatch):
    """More than 2^30 paths lead from forward to f30: the check walks each defun's calls at
    most twice, as a root and as a callee (a finished defun's depth is kept), counted by the
    iterators it makes over them."""
    defuns = "".join(f"(defun f{i} (x) (+ (f{i + 1} x) (f{i + 1} x) (g{i + 1} x)))\n(defun g{i} (x) (f{i} x))\n"
                     for i in range(30))  # fmt: skip
    walked = []

    def counted(items):
        walked.append(items)
        assert len(walked) <= 2 * 63, "the check walks paths, not defuns"
        return iter(items)

    monkeypatch.setattr(calls, "iter", counted, raising=False)
    graphs = traced(
        defuns + "(defun f30 (x) x)\n(defun g30 (x) x)\n(defun forward (x) (f0 x))"
    )
    assert len(graphs) == 63 and len(walked) > 63
