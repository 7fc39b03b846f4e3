"""A `let`-bound number of consts and &key arguments that the method writes more than once
is a local, assigned before its first statement (T5's `buckets`); read once, or made of a
loop's index, it is written in place. And `log`, `exp`, `sqrt` of literals are written as
the source spells them (`math.sqrt(5)`), computing the same double. Each module against
the same computation in plain PyTorch."""

from __future__ import annotations

import math
import re

import pytest
import torch

from conftest import load_module
from sx2torch.compiler import compile_source

HALVED = (
    "(defconst n 8)\n"
    "(defun forward (x &key (halve true))\n"
    "  (let ((m (if halve (// n 2) n))\n"
    "        (k (// m 2)))\n"
    "    (+ (slice x :axis -1 :end m) (* (slice x :axis -1 :start k :end (+ k m)) k))))\n"
)


def _body(code: str, method: str) -> str:
    """The top model's method's text."""
    return code.split("class Model(")[1].split(f"def {method}(")[1].split("\n\n")[0]


@pytest.mark.parametrize("halve", [True, False])
def test_a_number_written_twice_is_a_local_of_its_source_name(halve):
    code = compile_source(HALVED, "model.lisp")
    body = _body(code, "forward")
    assert "m = self.n // 2 if halve else self.n\n" in body
    assert "k = m // 2\n" in body
    assert body.count("self.n // 2") == 1  # not inlined at each read
    x = torch.randn(2, 16)
    m = 8 // 2 if halve else 8
    k = m // 2
    want = x[..., :m] + x[..., k : k + m] * k
    assert torch.equal(load_module(code).Model()(x, halve=halve), want)


def test_a_number_written_once_or_of_a_loop_index_is_written_in_place():
    text = (
        "(defconst n 8)\n"
        "(defmodel block (&key (d 2)) (defparam w (ones [d]))\n"
        "  (defun forward (x) (* x w)))\n"
        "(defparam layers (stack 2 (block :d n)))\n"
        "(defun forward (x &key (halve true))\n"
        "  (let ((once (if halve (// n 2) n)))\n"
        "    (for (i layer layers) ((h (slice x :axis -1 :end once)))\n"
        "      (let ((j (+ i 1)))\n"
        "        (* (layer (concat [h h] :axis -1)) (+ j j))))))\n"
    )
    body = _body(compile_source(text, "model.lisp"), "forward")
    assert not re.search(r"^\s*(once|j) = ", body, re.M)
    assert "x[..., : self.n // 2 if halve else self.n]" in body
    assert "(i + 1 + (i + 1))" in body


def test_a_function_of_literals_is_written_as_the_source_spells_it():
    text = (
        "(defparam w (kaiming-uniform [3 4] :a (sqrt 5)))\n"
        "(defun forward (x) (* (linear x w) (sqrt (/ 2.0 3.141592653589793))"
        " (log 2.0) (int 2.9)))\n"
    )
    code = compile_source(text, "model.lisp")
    assert "a=math.sqrt(5)" in code
    assert "math.sqrt(2.0 / 3.141592653589793)" in code
    assert "math.log(2.0)" in code and "* 2\n" in code  # int folds: 2
    torch.manual_seed(0)
    model = load_module(code).Model()
    torch.manual_seed(0)
    w = torch.nn.init.kaiming_uniform_(torch.empty(3, 4), a=math.sqrt(5))
    assert torch.equal(model.w, w)
    x = torch.randn(2, 4)
    want = x @ w.T * 0.7978845608028654 * 0.6931471805599453 * 2
    assert torch.equal(model(x), want)


def test_a_long_chain_of_lets_keeps_the_number_read_twice():
    """300 lets, each of the one before (their numbers nest 300 deep): the one read twice
    is the one local, the last, read once, is written in place of its name."""
    binds = " ".join(
        f"(a{i} ({'+' if i % 2 else '-'} {f'a{i - 1}' if i else 'n'} 2))"
        for i in range(300)
    )
    text = f"(defconst n 3)\n(defun forward (x) (let ({binds}) (* x a299 a150)))\n"
    code = compile_source(text, "model.lisp")
    body = _body(code, "forward")
    assert re.findall(r"^\s*(\w+) = ", body, re.M) == ["a150"]
    x = torch.randn(3)
    a150 = 3 - 2  # each even one n - 2, each odd one that + 2
    assert torch.equal(load_module(code).Model()(x), x * (a150 + 2) * a150)


@pytest.mark.parametrize("read", ["factor", "bound", "key"])
def test_a_thousand_lets_of_consts_compile(read):
    """1,000 lets, each of the one before (their numbers nest 1,000 deep): read as a
    factor, as a slice's bound (checked for each instance's consts), or from a key, the
    module computes the chain with the const, or key, each instance or call gives."""
    start = "k" if read == "key" else "n"
    binds = " ".join(
        f"(a{i} ({'+' if i % 2 else '-'} {f'a{i - 1}' if i else start} 2))"
        for i in range(1000)
    )
    value = {
        "factor": "(* x a999 a500)",
        "bound": "(slice x :axis -1 :end a999)",
        "key": "(slice x :axis -1 :end a999)",
    }[read]
    text = (
        "(defconst n 3)\n" f"(defun forward (x &key (k 5)) (let ({binds}) {value}))\n"
    )
    module = load_module(compile_source(text, "model.lisp"))
    x = torch.randn(2, 8)
    for n in (3, 6):  # each odd let is the start, each even one the start - 2
        model = module.Model(n=n) if read != "key" else module.Model()
        got = model(x, k=n) if read == "key" else model(x)
        want = x * n * (n - 2) if read == "factor" else x[..., :n]
        assert torch.equal(got, want)


def _chain(step: str, count: int, start: str = "n") -> str:
    """`count` lets, a0 of `start` and each a`i` of the one before: `step` with `{}`."""
    return " ".join(
        f"(a{i} {step.format(f'a{i - 1}' if i else start, i)})" for i in range(count)
    )


def test_lets_each_inside_the_one_before_are_cut_into_locals():
    """1,000 lets each nested inside the next, `(- 3 (- a 1))`, would be written in place
    1,000 parentheses deep (libcst recursed once per level; Python's parser refuses 200):
    every 24th is a local, the next ones written with its name, and the module computes the
    chain for each instance's const."""
    text = (
        "(defconst n 3)\n"
        f"(defun forward (x) (let ({_chain('(- 3 (- {} 1))', 1000)}) (* x a999)))\n"
    )
    code = compile_source(text, "model.lisp")
    body = _body(code, "forward")
    assert re.findall(r"^\s*(\w+) = ", body, re.M) == [
        f"a{i}" for i in range(23, 999, 24)
    ]
    definition = body.split("a47 = ")[1].split("a71 = ")[0]
    assert "a23" in definition and "self.n" not in definition  # it starts at a23
    x = torch.randn(3)
    for n in (3, 7):
        a = n
        for _ in range(1000):
            a = 3 - (a - 1)
        assert torch.equal(load_module(code).Model(n=n)(x), x * a)


def test_lets_of_conditionals_and_long_chains_are_cut_into_locals():
    """1,000 lets each choosing the one before, `(if flag a (+ n i))`, and 2,500 lets each
    adding 1 to the one before (a chain of 2,500 operands, where Python's compiler refuses
    about 3,000; main refused it at 2,000): locals keep each expression within bounds, and
    the module computes each chain."""
    chosen = _chain("(if flag {} (+ n {}))", 1000)
    module = load_module(
        compile_source(
            "(defconst n 3)\n"
            f"(defun forward (x &key (flag true)) (let ({chosen})"
            " (slice x :axis -1 :end a999)))\n",
            "model.lisp",
        )
    )
    x = torch.randn(2, 1100)
    for flag in (True, False):
        assert torch.equal(
            module.Model(n=5)(x, flag=flag), x[..., : 5 if flag else 1004]
        )
    code = compile_source(
        f"(defconst n 3)\n(defun forward (x) (let ({_chain('(+ {} 1)', 2500)})"
        " (* x a2499)))\n",
        "model.lisp",
    )
    assert re.findall(r"^\s*(\w+) = ", _body(code, "forward"), re.M) == ["a1999"]
    assert torch.equal(load_module(code).Model(n=-7)(x), x * 2493)


def test_a_lets_number_is_one_operand_of_a_later_chain():
    """`(+ a a)` of a let's `a = (+ n 1)` adds a to a: a is written by its name where it
    is kept (main folded it into `self.n + 1 + (self.n + 1)`, a's name lost)."""
    text = (
        "(defconst n 3)\n"
        "(defun forward (x) (let ((a (+ n 1)) (b (+ a a)) (c (* b (- 2 b)))) (* x c b)))\n"
    )
    code = compile_source(text, "model.lisp")
    body = _body(code, "forward")
    assert "a = self.n + 1\n" in body and "b = a + a\n" in body
    x = torch.randn(3)
    b = 2 * (5 + 1)
    assert torch.equal(load_module(code).Model(n=5)(x), x * (b * (2 - b)) * b)
