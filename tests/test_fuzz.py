"""Property tests: whatever the input, the CLI ends with exit 0 and a module that compiles and black
leaves alone, or exit 1 and a located diagnostic; never a traceback or an internal compiler error.

Programs come from the grammar (every registered op, with arguments of the kinds its signature
asks for), then are mutated (near-valid), and the example files are mutated as tools/fuzz.py does.
"""

from __future__ import annotations

import functools
import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # tools/ is beside the package, not in it

from sx2torch.ops import REGISTRY  # noqa: E402
from tools import fuzz  # noqa: E402

SETTINGS = settings(
    deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
EXAMPLES = fuzz.seeds()
POOL = sorted(
    {t for data in EXAMPLES for t in fuzz.tokens(data) if len(t) < 40} | set(fuzz.ODD)
)
NAMES = [
    "x",
    "y",
    "h",
    "w",
    "d",
    "n",
    "eps",
    "self",
    "torch",
    "sx",
    "F",
    "nn",
    "class",
    "lambda",
    "x-y",
    "x_y",
    "?",
]
OPS = sorted(REGISTRY)
DOCS = ["doc", 'a \\"quoted\\" doc', "", '\\"\\"\\"', "back\\\\slash", "two\nlines"]


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "model.lisp"


def assert_sound(path: Path, data: bytes) -> None:
    kind, finding = fuzz.check(path, data)
    assert finding is None, (finding, data)


# The grammar.

names = st.sampled_from(NAMES)
ints = st.integers(-3, 8)
numbers = st.one_of(
    ints.map(str), st.sampled_from(["0.5", "-2.5", "1e-6", "0.02", "1e30", "-0.0"])
)
keywords = st.sampled_from([":f32", ":bf16", ":high", ":axis", ":low"])


def argument(kind: str, expr) -> st.SearchStrategy:
    if kind in ("tensor", "ids", "bool-tensor", "like"):
        return expr
    if kind == "tensors":
        return st.lists(expr, min_size=1, max_size=3).map(
            lambda xs: "[" + " ".join(xs) + "]"
        )
    if kind == "ints":
        return st.lists(ints.map(str) | names, max_size=3).map(
            lambda xs: "[" + " ".join(xs) + "]"
        )
    if kind == "int":
        return ints.map(str) | names
    if kind == "number":
        return numbers | names
    if kind == "bool":
        return st.sampled_from(["true", "false"])
    return st.sampled_from([":f32", ":bf16"])  # dtype, out


@st.composite
def op_call(draw, expr) -> str:
    op = REGISTRY[draw(st.sampled_from(OPS))]
    least, most = op.bounds
    count = draw(st.integers(least, least + 2 if most is None else most))
    args = [
        draw(argument(op.args[min(i, len(op.args) - 1)].kind, expr))
        for i in range(count)
    ]
    for key in op.keys:
        if draw(st.booleans()):
            args += [f":{key.name}", draw(argument(key.kind, expr))]
    return f"({op.name} {' '.join(args)})".replace(" )", ")")


# Built once: validating a new recursive strategy at every draw was 3/4 of the tests' time.
@functools.cache
def expressions(calls: bool) -> st.SearchStrategy:
    leaves = st.sampled_from(["x", "x", "w", "d", "1.5", "2"])

    def extend(expr):
        return st.one_of(
            op_call(expr),
            st.tuples(names, expr, expr).map(
                lambda t: f"(let (({t[0]} {t[1]})) {t[2]})"
            ),
            expr.map(lambda e: f"(with-numerics (:sensitivity :high) {e})"),
            expr.map(lambda e: f"(with-numerics (:precision :bf16) {e})"),
            st.tuples(expr, st.sampled_from([":f32", ":bf16"])).map(
                lambda t: f"(cast {t[0]} {t[1]})"
            ),
            st.tuples(expr, names).map(lambda t: f"(gradient {t[0]} {t[1]})"),
            *([expr.map(lambda e: f"(helper {e})")] if calls else []),
        )

    return st.recursive(leaves, extend, max_leaves=8)


@st.composite
def programs(draw) -> str:
    head = [f"(defconst d {draw(st.integers(1, 6))})"]
    head.append(
        f"(defparam w (normal [d {draw(st.sampled_from(['d', '4', '(* 2 d)']))}] :std 0.02))"
    )
    doc = draw(st.sampled_from(DOCS))
    body = [f'(defun helper (x) "{doc}" {draw(expressions(calls=False))})']
    body.append(f"(defun forward (x) {draw(expressions(calls=True))})")
    body.append(f"(defrun train :precision {draw(st.sampled_from([':f32', ':bf16']))})")
    return "\n".join(head + draw(st.permutations(body))) + "\n"


@settings(SETTINGS, max_examples=250)
@given(program=programs())
def test_grammar_programs(path, program):
    assert_sound(path, program.encode())


@settings(SETTINGS, max_examples=250)
@given(program=programs(), seed=st.integers(0, 2**32 - 1))
def test_near_valid_programs(path, program, seed):
    assert_sound(
        path, fuzz.mutate(program.encode(), random.Random(seed), POOL, EXAMPLES)
    )


@settings(SETTINGS, max_examples=600)
@given(example=st.sampled_from(EXAMPLES), seed=st.integers(0, 2**32 - 1))
def test_mutated_examples(path, example, seed):
    assert_sound(path, fuzz.mutate(example, random.Random(seed), POOL, EXAMPLES))


@settings(SETTINGS, max_examples=200)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes(path, data):
    assert_sound(path, data)


def test_the_examples_are_the_seeds():
    assert len(EXAMPLES) >= 5


# Regressions: inputs the campaign (python -m tools.fuzz) or these tests found.

REGRESSIONS = {
    "unicode space inside a token": "(defun forward (x)\n  (relu\u00a0x))\n",
    "line separator between tokens": "(defun forward (x)\u2028 (relu x))\n",
    "keyword const read as a number": "(defconst k :foo)\n(defun forward (x) (+ x k))\n",
    "keyword default of a const": "(defconst k :foo)\n(defun forward (x) x)\n",
    "keyword default of a &key": "(defun f (x &key (m :bar)) x)\n(defun forward (x) (f x))\n",
    "float arithmetic overflowing to inf": "(defun forward (x) (* x (* 1e300 1e300)))\n",
    "const overflowing to inf": "(defconst k (* 1e300 1e300))\n(defun forward (x) (* x k))\n",
    "integer beyond 64 bits": "(defun forward (x) (* x 99999999999999999999999))\n",
    "integer with too many digits for str()": "(defun forward (x) (* x "
    + "9" * 5000
    + "))\n",
    "models holding each other": "(defmodel a () (defparam q (b)) (defun forward (x) (q x)))\n"
    "(defmodel b () (defparam p (a)) (defun forward (x) (p x)))\n(defparam m (a))\n(defun forward (x) (m x))\n",
    "a defmodel named as the file": "(defmodel model () (defun forward (x) x))\n(defparam m (model))\n"
    "(defun forward (x) (m x))\n",
    "a long chain of defun calls": "".join(
        f"(defun f{i} (x) (relu (f{i + 1} x)))\n" for i in range(500)
    )
    + "(defun f500 (x) x)\n(defun forward (x) (f0 x))\n",
    "many paths through the call graph": "".join(
        f"(defun f{i} (x) (+ (f{i + 1} x) (f{i + 1} x)))\n" for i in range(40)
    )
    + "(defun f40 (x) x)\n(defun forward (x) (f0 x))\n",
    "a cast that needs a temporary name": "(defparam w (normal [3]))\n(defun helper (x) 2)\n"
    "(defun forward () (helper (with-numerics (:sensitivity :high) (cast w :f32))))\n",
    "a gradient of a value independent of X": "(defparam w (zeros [3]))\n(defun forward (x) (gradient (sum w) x))\n",
    "a defun's scalar result passed to a defun": "(defun helper (x) 2)\n(defun forward (x) (helper (helper x)))\n",
    "a sum of 300 terms": "(defun forward (x) (+" + " x" * 300 + "))\n",
    "an integer literal read through an attribute": "(defun forward (pos)\n  (gradient (sum (matmul pos 16)) pos))\n",
    "a number sliced (a SyntaxWarning in the output)": "(defun forward (x) (slice 0 :end 2))\n",
    "a let binding named as a defun": "(defun f (x) (let ((f (relu x))) f))\n(defun forward (x) (f x))\n",
    "a const of a thousand operands": "(defconst k 2)\n(defconst j (+ k"
    + " 1" * 1000
    + "))\n"
    "(defun forward (x) (* x j))\n",
    "a body of a thousand compile-time operands": "(defconst k 2)\n(defun forward (x) (* x (+ k"
    + " 1" * 1000
    + ")))\n",
    "a tensor and a thousand operands": "(defun forward (x) (+ x"
    + " 1" * 1000
    + "))\n",
    "thirty nested with-numerics": "(defun forward (x) "
    + "(with-numerics (:sensitivity :high) (with-numerics (:precision :bf16) " * 15
    + "(exp x)"
    + "))" * 15
    + ")\n(defrun r :precision :bf16)\n",
    "a defun call with a repeated keyword": "(defun f (x &key (k 1)) (* x k))\n"
    "(defun forward (x) (f x :k 2.0 :k 3.0))\n",
    "a parameter of shape []": "(defparam z (zeros []))\n(defun forward (x) (+ x z))\n",
    "a quadratic number of string scans": '(defun forward (x) "'
    + '\\"' * 20000
    + '" x)\n'
    + '"a" ' * 20000,
}


@pytest.mark.parametrize("name", REGRESSIONS)
def test_regression(path, name):
    kind, finding = fuzz.check(path, REGRESSIONS[name].encode(), limit_s=20)
    assert finding is None
