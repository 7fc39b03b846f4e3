"""trace: defun bodies -> graphs of nodes, names resolved, scalars folded, with-numerics frames stamped."""

from __future__ import annotations

import pytest

from sx2torch import resolve, trace
from sx2torch.syntax import read
from sx2torch.errors import SourceError, Span
from sx2torch.ir import ISLAND, REGION, Node, Scalar
from sx2torch.ops import REGISTRY
from sx2torch.syntax.names import FORMS
from sx2torch.trace.forms import HANDLERS

HEAD = "(defconst d 4)\n(defparam w (normal [d d]))\n"


def graph(body: str, name: str = "forward"):
    program = resolve.run(read.run(HEAD + body), "net")
    return trace.run(program)["net", name]


def error(body: str) -> tuple:
    with pytest.raises(SourceError) as caught:
        graph(body)
    return caught.value.span.line, caught.value.span.col, caught.value.message


def test_every_special_form_has_a_handler_and_nothing_else_does():
    # resolve refuses a defun named as one of syntax's FORMS; trace dispatches on HANDLERS
    assert set(HANDLERS) == FORMS


def test_nodes_in_trace_order_with_names_and_spans():
    g = graph("(defun forward (x)\n  (let ((h (relu (matmul x w))))\n    (+ h 1)))")
    assert [(n.what, n.name, n.span) for n in g.nodes] == [
        ("param", "w", Span(4, 28)),
        ("matmul", None, Span(4, 18)),
        ("relu", "h", Span(4, 12)),
        ("+", None, Span(5, 5)),
    ]
    assert g.output is g.nodes[-1] and g.nodes[1].inputs == (g.inputs[0], g.nodes[0])


def test_a_param_is_read_once():
    g = graph("(defun forward (x) (+ (matmul x w) (matmul x w)))")
    assert [n.what for n in g.nodes].count("param") == 1


def test_scalars_fold_and_keep_their_consts():
    g = graph("(defun forward (x) (* x (// (* d 6) 3)))")
    (param_free,) = [n for n in g.nodes if n.what == "*"]
    scalar = param_free.inputs[1]
    assert isinstance(scalar, Scalar) and scalar.value == 8 and scalar.op == "//"
    assert graph("(defun forward (x) (+ 1 2))").output == Scalar.lit(
        3
    )  # literals fold to a literal


def test_an_op_node_holds_its_registry_entry():
    """A traced op's node holds the op's entry, whose fields the passes read. A lookup by
    the entry gives it back (code written when `node.op` was a name still runs), and a
    comparison of an entry with a name is an error, not a silent False."""
    (relu,) = graph("(defun forward (x) (relu x))").nodes
    assert relu.op is REGISTRY["relu"] and relu.op.name == "relu"
    assert REGISTRY[relu.op] is REGISTRY.get(relu.op) is relu.op and relu.op in REGISTRY
    assert relu.op != REGISTRY["exp"]
    with pytest.raises(TypeError, match="compared with the string 'relu'"):
        relu.op == "relu"


def test_unused_nodes_are_dropped():
    g = graph("(defun forward (x) (let ((unused (exp x))) (relu x)))")
    assert [n.what for n in g.nodes] == ["relu"]


def test_with_numerics_frames():
    g = graph(
        "(defun forward (x)\n"
        "  (with-numerics (:precision :bf16)\n"
        "    (+ (exp x) (with-numerics (:sensitivity :high) (tanh x)))))"
    )
    modes = {n.what: [f.mode for f in n.frames] for n in g.nodes}
    assert modes == {"exp": [REGION], "tanh": [REGION, ISLAND], "+": [REGION]}


def test_library_marks_are_islands():
    (softmax,) = graph("(defun forward (x) (softmax x))").nodes
    assert softmax.mode == ISLAND and softmax.frames[-1].library


def test_keyword_arguments_and_defaults():
    (node,) = graph("(defun forward (x) (sum x :axes [0 -1]))").nodes
    assert [a.value for a in node.attrs["axes"]] == [0, -1] and node.attrs[
        "keepdims"
    ] == Scalar.lit(False)


def test_calls():
    g = graph("(defun f (a &key (k 2)) (* a k))\n(defun forward (x) (f x :k d))")
    (call,) = g.nodes
    assert (call.what, call.attrs["target"], call.attrs["keys"]["k"].value) == (
        "call",
        "f",
        4,
    )


@pytest.mark.parametrize(
    "body, line, col, message",
    [
        ("(defun forward (x) (relu y))", 3, 26, "unknown name 'y': expected an argument, a let local, a const or a param"),
        ("(defun forward (x) (relu relu))", 3, 26, "'relu' is a function: call it, as (relu ...)"),
        ("(defun forward (x) (x 1))", 3, 21, "'x' is a value, not a function"),
        ("(defun forward (x) (d 1))", 3, 21, "'d' is a value, not a function"),
        ("(defun forward (x) (1 x))", 3, 21, "expected an op or function name, got 1"),
        ("(defun forward (x) ())", 3, 20, "an empty list is not a value"),
        ("(defun forward (x) :k)", 3, 20, "a keyword is not a value here"),
        ("(defun forward (x) (let ((y [x])) y))", 3, 29, "a vector is not a value here"),
        ("(defun forward (x) [x])", 3, 20, "a defun returns a vector of two or more values"),
        ("(defun forward (x) (let (x) x))", 3, 26, "expected a binding (NAME EXPR)"),
        ("(defun forward (x) (let x x))", 3, 25, "expected the bindings ((NAME EXPR) ...), got 'x'"),
        ("(defun forward (x) (sum x :axes 0))", 3, 33, ":axes must be a vector of integers, such as [0 -1]"),
        ("(defun forward (x) (sum x :axes [1.5]))", 3, 34, "each of :axes must be an integer, got 1.5"),
        ("(defun forward (x) (sum x :axes [0] :axes [1]))", 3, 37, ":axes given twice"),
        ("(defun forward (x) (sum x :keepdims 1))", 3, 37, ":keepdims must be true or false"),
        ("(defun forward (x) (sum x :axes))", 3, 27, "keyword :axes without a value"),
        ("(defun forward (x) (sum :axes [0] x))", 3, 35, "expected a keyword: positional arguments come before keywords"),
        ("(defun forward (x) (matmul x w :out :bf16))", 3, 37, ":out must be :f32, got :bf16"),
        ("(defun forward (x) (with-numerics (:sensitivity) x))", 3, 35,
         "expected one option, (:sensitivity :high) or (:precision :bf16)"),
        ("(defun forward (x) (with-numerics (:precision :f32) x))", 3, 47, ":precision must be :bf16, got :f32"),
        ("(defun forward (x) (cast x))", 3, 20, "wrong number of arguments: expected (cast X DTYPE), as (cast x :bf16), got 1"),
        ("(defun forward (x) (cast x f32))", 3, 28, "expected :f32 or :bf16 or :i64 or :i32 or :bool, got 'f32'"),
        ("(defun f (a) a)\n(defun forward (x) (f 2))", 4, 23, "pass numbers to a defun as &key arguments"),
        ("(defun f (a &key (k 1)) a)\n(defun forward (x) (f x :k x))", 4, 28,
         "expected a number known at compile time, got a tensor"),
        ("(defun forward (x) (chain w x))", 3, 27, "'w' is not a stack of sub-models"),
        ("(defun forward (x) (slice 0 :end d))", 3, 20, "'slice' needs a tensor argument, got only numbers known at compile time"),
        ("(defun forward (x &key (k :fast)) (* x k))", 3, 40, "'k' is the keyword :fast, not a number or a tensor"),
    ],
)  # fmt: skip
def test_errors(body, line, col, message):
    assert error(body) == (line, col, message)


def test_every_node_has_a_span_inside_the_source():
    g = graph("(defun forward (x)\n  (softmax (+ (rms-norm x) (layer-norm x))))")
    assert all(isinstance(n, Node) and n.span.line in (4, 5) for n in g.nodes)
