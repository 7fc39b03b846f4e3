"""Every malformed input gets `FILE:LINE:COL: error: MESSAGE`, the source line and a caret; exit 1, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sx2torch import cli, trace

# name: (source, line, col, message)
CASES = {
    "open-paren": (
        b"(defun forward (x)\n  (relu x)\n",
        1,
        1,
        "'(' is never closed: expected ')' before the end of the file",
    ),
    "close-paren": (
        b"(defun forward (x)\n  (relu x)))\n",
        2,
        12,
        "unexpected ')': there is no open bracket to close",
    ),
    "mismatched": (
        b"(defun forward (x)\n  (sum x :axes [0)))\n",
        2,
        18,
        "expected ']' to close the '[' at line 2, column 16, got ')'",
    ),
    "open-bracket": (
        b"(defparam w (zeros [3 4))\n",
        1,
        24,
        "expected ']' to close the '[' at line 1, column 20, got ')'",
    ),
    "string": (
        b'(defun forward (x)\n  "never closed\n  x)\n',
        2,
        3,
        "unterminated string: expected a closing '\"' before the end of the file",
    ),
    "utf8": (
        b"(defun forward (x)\n  (relu \xff x))\n",
        2,
        9,
        "the file is not valid UTF-8 (byte ff)",
    ),
    "utf8-comment": (
        b"; caf\xe9\n(defun forward (x) x)\n",
        1,
        6,
        "the file is not valid UTF-8 (byte e9)",
    ),
    "unknown-name": (
        b"(defun forward (x)\n  (relu y))\n",
        2,
        9,
        "unknown name 'y': expected an argument, a let local, a const or a param",
    ),
    "unknown-name-close": (
        b"(defun forward (input)\n  (relu inptu))\n",
        2,
        9,
        "unknown name 'inptu': expected an argument, a let local, a const or a param (did you mean 'input'?)",
    ),
    "unknown-op": (
        b"(defun forward (x)\n  (frobnicate x))\n",
        2,
        4,
        "unknown op or function 'frobnicate'",
    ),
    "unknown-op-close": (
        b"(defun forward (x)\n  (sofmax x))\n",
        2,
        4,
        "unknown op or function 'sofmax' (did you mean 'softmax'?)",
    ),
    "arity-op": (
        b"(defun forward (x)\n  (relu x x))\n",
        2,
        3,
        "wrong number of arguments: expected (relu X), got 2",
    ),
    "arity-defun": (
        b"(defun twice (a b) (+ a b))\n(defun forward (x)\n  (twice x))\n",
        3,
        3,
        "wrong number of arguments: expected (twice a b), got 1",
    ),
    "arity-defconst": (
        b"(defconst d)\n(defun forward (x) x)\n",
        1,
        1,
        "wrong number of arguments: expected (defconst NAME VALUE [DOC]), got 1",
    ),
    "unknown-key": (
        b"(defun forward (x)\n  (softmax x :axiz -1))\n",
        2,
        14,
        "unknown keyword :axiz for 'softmax': did you mean :axis? (known: :axis, :dtype)",
    ),
    "unknown-key-defun": (
        b"(defun f (x &key (k 2)) (* x k))\n(defun forward (x) (f x :j 3))\n",
        2,
        25,
        "unknown keyword :j for 'f' (known: :k)",
    ),
    "precision": (
        b"(defun forward (x) x)\n(defrun train :precision :fp16)\n",
        2,
        26,
        ":precision must be :f32 or :bf16, got :fp16",
    ),
    "reduction": (
        b"(defun forward (x y)\n  (cross-entropy x y :reduction :max))\n",
        2,
        33,
        ":reduction must be :mean, :sum or :none, got :max",
    ),
    "sensitivity": (
        b"(defun forward (x)\n  (with-numerics (:sensitivity :low) x))\n",
        2,
        32,
        ":sensitivity must be :high, got :low",
    ),
    "cast": (
        b"(defun forward (x)\n  (cast x :f64))\n",
        2,
        11,
        "expected :f32 or :bf16 or :i64 or :i32 or :bool, got :f64",
    ),
    "shape-not-vector": (
        b"(defparam w (zeros 3))\n(defun forward (x) x)\n",
        1,
        20,
        "a shape must be a vector of integers and constants, such as [d (* 4 d)]",
    ),
    "shape-name": (
        b"(defconst d 4)\n(defparam w (zeros [d n]))\n(defun forward (x) x)\n",
        2,
        23,
        "unknown name 'n': expected a const defined above",
    ),
    "shape-float": (
        b"(defparam w (zeros [3 1.5]))\n(defun forward (x) x)\n",
        1,
        23,
        "a size must be an integer, got 1.5",
    ),
    "shape-keyword": (
        b"(defparam w (zeros [3 :a]))\n(defun forward (x) x)\n",
        1,
        23,
        "a size must be an integer, got :a",
    ),
    "run-key": (
        b"(defun forward (x) x)\n(defrun train :precission :bf16)\n",
        2,
        15,
        "unknown keyword :precission in defrun (known: :precision, :loss, :optimizer, :steps, :batch-size, :seq-len, :schedule, :grad-clip, :inputs, :generate, :tp-reduce)",
    ),
    "duplicate": (
        b"(defun forward (x) x)\n(defconst d 1)\n(defparam d (zeros [3]))\n",
        3,
        11,
        "'d' is already defined in this model, at line 2, column 11",
    ),
    "duplicate-defun": (
        b"(defun forward (x) x)\n(defun forward (x) (relu x))\n",
        2,
        8,
        "'forward' is already defined in this model, at line 1, column 8",
    ),
    "duplicate-model": (
        b"(defmodel m () (defun forward (x) x))\n(defmodel m () (defun forward (x) x))\n(defun forward (x) x)\n",
        2,
        11,
        "model 'm' is already defined",
    ),
    "recursion": (
        b"(defun forward (x)\n  (relu (forward x)))\n",
        2,
        10,
        "defun 'forward' calls itself (forward -> forward); recursion is not supported",
    ),
    "mutual-recursion": (
        b"(defun ping (x) (pong x))\n(defun pong (x) (ping x))\n(defun forward (x) (ping x))\n",
        2,
        18,
        "defun 'ping' calls itself (ping -> pong -> ping); recursion is not supported",
    ),
    "no-forward": (
        b"(defconst d 4)\n(defun f (x) x)\n",
        1,
        1,
        "the file defines no 'forward' defun: expected (defun forward (x ...) ...)",
    ),
    "model-cycle": (
        b"(defmodel a () (defparam q (b)) (defun forward (x) (q x)))\n"
        b"(defmodel b () (defparam p (a)) (defun forward (x) (p x)))\n"
        b"(defparam m (a))\n(defun forward (x) (m x))\n",
        2,
        26,
        "model 'a' contains itself (a -> b -> a)",
    ),
    "model-named-as-file": (
        b"(defmodel model () (defun forward (x) x))\n(defun forward (x) x)\n",
        1,
        11,
        "a defmodel cannot be named 'model': the file's top model has that name",
    ),
    "keyword-const": (
        b"(defconst mode :fast)\n(defun forward (x) (* x mode))\n",
        2,
        25,
        "'mode' is the keyword :fast, not a number or a tensor",
    ),
    "shape-matmul": (
        b"(defparam a (normal [3 4]))\n(defparam b (normal [5 6]))\n(defun forward (x)\n  (+ x (matmul a b)))\n",
        4,
        8,
        "matmul of [3 4] and [5 6]: the inner sizes differ (4 against 5)",
    ),
    "matmul-of-0d": (  # torch refuses it when the module runs
        b"(defparam v (normal [4]))\n(defun forward (x)\n  (linear x (sum v)))\n",
        3,
        3,
        "a matrix product of a 0-d value (an element, a full reduction or a parameter of "
        "shape []): each operand needs an axis to multiply along; scale with * instead",
    ),
    "shape-broadcast": (
        b"(defparam a (normal [3 4]))\n(defparam b (normal [5 6]))\n(defun forward (x)\n  (* x (+ a b)))\n",
        4,
        8,
        "the shapes [3 4] and [5 6] do not broadcast: 4 against 6 on axis -1",
    ),
    "shape-through-ops": (
        b"(defparam a (normal [3 4]))\n(defun forward (x)\n  (let ((t (transpose a [1 0])))\n    (matmul (relu t) (sum (reshape a [2 6]) :axes [0] :keepdims true))))\n",
        4,
        5,
        "matmul of [4 3] and [1 6]: the inner sizes differ (3 against 1)",
    ),
    "shape-known-size-against-const": (
        b"(defconst d 4)\n(defparam a (normal [3 d]))\n(defparam b (normal [2 3]))\n(defun forward (x) (+ x (- a b)))\n",
        4,
        25,
        "the shapes [3 ?] and [2 3] do not broadcast: 3 against 2 on axis -2",
    ),
    "gradient-not-scalar": (
        b"(defparam w (normal [3 4]))\n(defun forward (x)\n  (gradient (sum (* w 2.0) :axes [0]) w))\n",
        3,
        13,
        "gradient needs a scalar Y: reduce it over all axes, as (sum ...) or (mean ...)",
    ),
    "gradient-in-loop-carried": (  # Y reads x only through c, which starts as x^2
        b"(defmodel blk () (defun forward (x) x))\n(defparam blocks (stack 2 (blk)))\n"
        b"(defun forward (x)\n  (for (layer blocks) ((c (square x))) (gradient (mean c) x)))\n",
        4,
        40,
        "this gradient reaches 'c', which the loop around it carries and which depends on "
        "'x' through the iterations before, and a backward does not go back through a "
        "loop's earlier iterations: take the gradient outside the loop",
    ),
    "overflow": (
        b"(defconst big (* 1e200 1e200))\n(defun forward (x) x)\n",
        1,
        15,
        "number out of range (with the consts at their defaults)",
    ),
    "int-range": (
        b"(defun forward (x) (* x 99999999999999999999))\n",
        1,
        25,
        "number out of range: 99999999999999999999",
    ),
    "float-range": (
        b"(defun forward (x) (* x 1e999))\n",
        1,
        25,
        "number out of range: 1e999",
    ),
    "unicode-space": (
        "(defun forward (x)\n  (relu\u00a0x))\n".encode(),
        2,
        8,
        "invalid character '\\xa0': expected a name (letters, digits and -_*+/<>=!?&.%), a bracket or a space",
    ),
    "nul": (
        b"(defun forward (x)\n  (relu x\x00))\n",
        2,
        10,
        "invalid character '\\x00': expected a name (letters, digits and -_*+/<>=!?&.%), a bracket or a space",
    ),
    "quote": (b"(defun forward (x) '(x))\n", 1, 20, "quoted data (') is not supported"),
    "call-depth": (
        b"".join(b"(defun f%d (x) (relu (f%d x)))\n" % (i, i + 1) for i in range(70))
        + b"(defun f70 (x) x)\n(defun forward (x) (f0 x))\n",
        64,
        23,
        "calls nested more than 64 defuns deep",
    ),
    "negative-stack": (
        b"(defmodel b () (defun forward (x) x))\n(defparam s (stack -1 (b)))\n(defun forward (x) (chain s x))\n",
        2,
        20,
        "a stack size must not be negative, got -1",
    ),
    "stack-of-an-op": (
        b"(defparam s (stack 2 (relu)))\n(defun forward (x) (chain s x))\n",
        1,
        22,
        "unknown initializer or model 'relu'",
    ),
    "shape-name-close": (
        b"(defconst dim 4)\n(defparam w (normal [dm 4]))\n(defun forward (x) x)\n",
        2,
        22,
        "unknown name 'dm': expected a const defined above (did you mean 'dim'?)",
    ),
    "const-nan": (
        b"(defconst k nan)\n(defun forward (x) (* x k))\n",
        1,
        13,
        "'nan' is not a constant: expected a number known at compile time",
    ),
    "shape-param": (
        b"(defparam v (zeros [2]))\n(defparam w (normal [v 4]))\n(defun forward (x) x)\n",
        2,
        22,
        "'v' is not a constant: expected a number known at compile time",
    ),
    "let-star": (
        b"(defun forward (x)\n  (let* ((h (relu x))) h))\n",
        2,
        4,
        "unknown op or function 'let*': 'let' binds in order already: (let ((a (f x)) (b (g a))) ...)",
    ),
    "setq": (
        b"(defun forward (x)\n  (setq x (relu x)))\n",
        2,
        4,
        "unknown op or function 'setq': there is no mutation: bind a new name with let, as (let ((h (relu h))) ...)",
    ),
    "keepdim": (
        b"(defun forward (x)\n  (sum x :axes [0] :keepdim true))\n",
        2,
        20,
        "unknown keyword :keepdim for 'sum': did you mean :keepdims? (known: :axes, :keepdims)",
    ),
    "axis-string": (
        b'(defun forward (x)\n  (softmax x :axis "last"))\n',
        2,
        20,
        ":axis must be an integer known at compile time (a literal, a const or a &key argument), got a string",
    ),
    "axis-keyword": (
        b"(defun forward (x)\n  (softmax x :axis :last))\n",
        2,
        20,
        ":axis must be an integer known at compile time (a literal, a const or a &key argument), got :last",
    ),
    "normal-negative-std": (
        b"(defparam w (normal [2] :std -1))\n(defun forward (x) x)\n",
        1,
        30,
        ":std must not be negative, got -1",
    ),
    "normal-negative-std-const": (
        b"(defconst s (- 0 0.5))\n(defparam w (normal [2] :std s))\n(defun forward (x) x)\n",
        2,
        30,
        ":std must not be negative, got -0.5",
    ),
    "uniform-empty-range": (
        b"(defparam w (uniform [2] :low 1 :high 0))\n(defun forward (x) x)\n",
        1,
        31,
        ":low must not be greater than :high, got :low 1 and :high 0",
    ),
    "uniform-empty-range-high": (
        b"(defparam w (uniform [2] :high -1))\n(defun forward (x) x)\n",
        1,
        32,
        ":low must not be greater than :high, got :low 0 and :high -1",
    ),
    "eye-negative": (
        b"(defparam w (eye -1))\n(defun forward (x) x)\n",
        1,
        18,
        "eye's size must not be negative, got -1",
    ),
    "eye-fractional": (
        b"(defparam w (eye 2.5))\n(defun forward (x) x)\n",
        1,
        18,
        "eye's size must be an integer, got 2.5",
    ),
    "linspace-fractional": (
        b"(defparam w (linspace 2.5))\n(defun forward (x) x)\n",
        1,
        23,
        "linspace's size must be an integer, got 2.5",
    ),
    "initializer-keyword": (
        b"(defparam w (normal [2] :std :wide))\n(defun forward (x) x)\n",
        1,
        30,
        "normal's std must be a number, got :wide",
    ),
    "repeated-key-defun": (
        b"(defun f (x &key (k 2)) (* x k))\n(defun forward (x) (f x :k 2.0 :k 3.0))\n",
        2,
        32,
        ":k given twice",
    ),
    "repeated-key-submodel": (
        b"(defmodel b () (defun forward (x &key (k 1)) (* x k)))\n(defparam m (b))\n"
        b"(defun forward (x) (m x :k 2 :k 3))\n",
        3,
        30,
        ":k given twice",
    ),
    "repeated-key-chain": (
        b"(defmodel b () (defun forward (x &key (k 1)) (* x k)))\n(defparam s (stack 2 (b)))\n"
        b"(defun forward (x) (chain s x :k 2 :k 3))\n",
        3,
        36,
        ":k given twice",
    ),
    "param-dtype": (
        b"(defparam w (zeros [2]) :dtype :f16)\n",
        1,
        32,
        ":dtype must be :f32 or :bf16, got :f16",
    ),
    "submodel-dtype": (
        b"(defmodel b () (defun forward (x) x))\n(defparam s (b) :dtype :bf16)\n",
        2,
        17,
        "a sub-model parameter takes no :numerics, :trainable, :persistent or :dtype",
    ),
    "concat-not-a-vector": (
        b"(defparam s (concat (zeros [2])))\n",
        1,
        21,
        "concat takes a vector of initializers, such as (concat [(zeros [1]) (full [3] -1.5)])",
    ),
    "concat-empty": (
        b"(defparam s (concat []))\n",
        1,
        21,
        "concat takes a vector of initializers, such as (concat [(zeros [1]) (full [3] -1.5)])",
    ),
    "concat-2-d-part": (
        b"(defparam s (concat [(zeros [2]) (eye 3)]))\n",
        1,
        34,
        "concat's parts must agree in all sizes but the first, got a eye of shape [3, 3] after one of shape [2]",
    ),
    "concat-0-d-part": (
        b"(defparam s (concat [(full [] 1.0) (zeros [2])]))\n",
        1,
        22,
        "concat's parts must have an axis, got a 0-D full",
    ),
    "concat-submodel-part": (
        b"(defmodel b () (defun forward (x) x))\n(defparam s (concat [(zeros [2]) (b)]))\n",
        2,
        34,
        "concat's parts are tensor initializers such as (zeros [n]), got 'b'",
    ),
    "concat-unknown-part": (
        b"(defparam s (concat [(zeroes [2])]))\n",
        1,
        22,
        "concat's parts are tensor initializers such as (zeros [n]), got 'zeroes'",
    ),
    "tensor-not-a-number": (
        b"(defparam s (tensor [0.5 :a]))\n",
        1,
        26,
        "tensor's values must be numbers, got :a",
    ),
    "tensor-arity": (
        b"(defparam s (tensor 0.5 1.0))\n",
        1,
        13,
        "wrong number of arguments: expected (tensor [VALUE ...]), got 2",
    ),
}


def compile_file(
    tmp_path, capsys, source: bytes, *options: str, name: str = "model.lisp"
) -> tuple:
    path = tmp_path / name
    path.write_bytes(source)
    rc = cli.main([str(path), *options])
    out, err = capsys.readouterr()
    return rc, out, err, str(path)


def expected_lines(source: bytes, line: int, col: int) -> tuple:
    shown = source.decode("utf-8", errors="replace").split("\n")[line - 1]
    shown = "".join(c if c.isprintable() else "?" for c in shown)
    return "  " + shown, "  " + " " * (col - 1) + "^"


@pytest.mark.parametrize("name", CASES)
def test_diagnostic_is_located(tmp_path, capsys, name):
    source, line, col, message = CASES[name]
    rc, out, err, path = compile_file(tmp_path, capsys, source)
    assert (rc, out) == (1, "")
    assert err.splitlines() == [
        f"{path}:{line}:{col}: error: {message}",
        *expected_lines(source, line, col),
    ]


def test_deep_nesting_is_bounded(tmp_path, capsys):
    source = b"(defun forward (x) " + b"(relu " * 10_000 + b"x" + b")" * 10_001 + b"\n"
    rc, out, err, path = compile_file(tmp_path, capsys, source)
    head, shown, caret = err.splitlines()
    assert (rc, out) == (1, "")
    assert head == f"{path}:1:398: error: forms nested deeper than 64 levels"
    assert len(shown) < 120 and shown[len(caret) - 1] == "(" and caret.strip() == "^"


def test_deep_vectors_are_bounded(tmp_path, capsys):
    rc, _, err, path = compile_file(tmp_path, capsys, b"[" * 100_000)
    assert rc == 1 and err.startswith(
        f"{path}:1:65: error: forms nested deeper than 64 levels\n"
    )


def test_empty_file(tmp_path, capsys):
    rc, _, err, path = compile_file(tmp_path, capsys, b"")
    assert (rc, err) == (
        1,
        f"{path}:1:1: error: the file defines no 'forward' defun: expected (defun forward (x ...) ...)\n",
    )


def test_crlf_and_tabs_keep_the_caret_under_the_column(tmp_path, capsys):
    rc, _, err, path = compile_file(
        tmp_path, capsys, b"(defun forward (x)\r\n\t(relu y))\r\n"
    )
    assert rc == 1
    assert err.splitlines() == [
        f"{path}:2:8: error: unknown name 'y': expected an argument, a let local, a const or a param",
        "   (relu y))",
        "         ^",
    ]


def test_control_characters_are_not_echoed_to_the_terminal(tmp_path, capsys):
    rc, _, err, _ = compile_file(
        tmp_path, capsys, b'(defun forward (x)\n  "\x1b[2J\x07" (relu y))\n'
    )
    assert rc == 1 and "\x1b" not in err and "\x07" not in err
    assert err.splitlines()[1:] == ['    "?[2J?" (relu y))', "                  ^"]


def test_a_byte_order_mark_is_not_a_column(tmp_path, capsys):
    rc, _, err, path = compile_file(
        tmp_path, capsys, b"\xef\xbb\xbf(defun forward (x) y)\n"
    )
    assert rc == 1 and err.startswith(f"{path}:1:20: error: unknown name 'y'")


def test_unknown_run_is_a_usage_error(tmp_path, capsys):
    source = b"(defun forward (x) x)\n(defrun train :precision :bf16)\n"
    rc, out, err, path = compile_file(tmp_path, capsys, source, "--run", "eval")
    assert (rc, out) == (2, "")
    assert err.splitlines() == [
        "sx2torch: error: --run eval: the file has no defrun of that name (known: train)"
    ]


@pytest.mark.parametrize(
    "source",
    [
        b"(defun forward (x)\n  (relu x)",
        b"(defun forward (x) (relu \xff))",
        b"(defun forward (x) (forward x))",
    ],
)
def test_no_traceback_from_the_command(tmp_path, source):
    path = tmp_path / "bad.lisp"
    path.write_bytes(source)
    result = subprocess.run(
        [sys.executable, "-m", "sx2torch", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"{path}:1:") and "Traceback" not in result.stderr


def test_a_compiler_bug_is_one_line(tmp_path, capsys, monkeypatch):
    def broken(program):
        raise KeyError("the tracer lost its way\nsecond line")

    monkeypatch.setattr(trace, "run", broken)
    rc, out, err, _ = compile_file(tmp_path, capsys, b"(defun forward (x) x)\n")
    assert (rc, out) == (3, "")
    assert err == (
        "sx2torch: internal compiler error: KeyError: 'the tracer lost its way\\nsecond line' "
        "(a bug in sx2torch: please report it with the source file; --traceback shows where)\n"
    )


def test_traceback_flag_shows_a_compiler_bug(tmp_path, capsys, monkeypatch):
    def broken(program):
        raise KeyError("the tracer lost its way")

    monkeypatch.setattr(trace, "run", broken)
    rc, _, err, _ = compile_file(
        tmp_path, capsys, b"(defun forward (x) x)\n", "--traceback"
    )
    assert rc == 3
    assert err.startswith("Traceback (most recent call last):\n")
    assert "in broken" in err and err.endswith("KeyError: 'the tracer lost its way'\n")
