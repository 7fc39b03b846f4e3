"""Flags a user flips after construction (issue 20, item 11): `(defflag NAME DEFAULT)` is a
constructor argument read only when the module runs, so setting it on a built module changes
the next forward; reading it where the constructor builds is a diagnostic."""

from __future__ import annotations

import pytest
import torch

from cases import lisp
from sx2torch import interpret
from sx2torch.compiler import Options, compile_module, compile_source
from sx2torch.errors import SourceError

SOURCE = lisp("flags").read_text()
BF16 = torch.bfloat16


def plain(model, ids, split: bool):
    table = model.embed if split else model.shared
    return torch.tanh(table.to(BF16)[ids]) @ model.out.to(BF16).T


def test_setting_the_flag_on_a_built_module_changes_the_next_forward(build):
    module, _ = build(SOURCE, "flags.lisp")
    model, ids = module.Flags(), torch.randint(0, 10, (2, 5))
    assert torch.equal(model(ids), plain(model, ids, split=False))
    model.split = True
    assert torch.equal(model(ids), plain(model, ids, split=True))
    built = module.Flags(split=True)
    built.load_state_dict(model.state_dict(), strict=True)
    assert torch.equal(built(ids), model(ids))


def test_a_compiled_module_follows_the_flag(build):
    module, _ = build(SOURCE, "flags.lisp")
    model, ids = module.Flags(), torch.randint(0, 10, (2, 5))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(ids), plain(model, ids, split=False))
    model.split = (
        True  # a guard on the attribute: the next call compiles the other branch
    )
    assert torch.equal(compiled(ids), plain(model, ids, split=True))
    torch._dynamo.reset()


def test_the_interpreter_takes_the_flag_as_a_const(build):
    module, _ = build(SOURCE, "flags.lisp")
    model, ids = module.Flags(split=True), torch.randint(0, 10, (2, 5))
    oracle = interpret.load(
        SOURCE, "flags.lisp", consts={"split": True}, state=model.state_dict()
    )
    assert torch.equal(oracle("forward", ids), model(ids))


BLK = "(defmodel blk (&key (wide false)) (defun forward (x) (if wide x (- x))))"


@pytest.mark.parametrize(
    "line",
    [
        "(defparam w (ones [(if big 8 4)]))",
        "(defparam w (ones [4]) :when big)",
        "(defconst n (if big 2 3))",
        f"{BLK}\n(defparam b (blk :wide big))",
        f"{BLK}\n(defparam bs (stack (i 2) (blk :wide (and big (= i 0)))))",
    ],
)
def test_a_flag_deciding_what_is_built_is_a_diagnostic(line):
    source = f"(defflag big false)\n{line}\n(defun forward (x) x)"
    lines = source.splitlines()
    at = max(n for n, text in enumerate(lines) if " big" in text)
    with pytest.raises(SourceError) as raised:
        compile_source(source, "m.lisp", Options())
    span = raised.value.span
    assert (span.line, span.col) == (at + 1, lines[at].index(" big") + 2)
    assert raised.value.message == (
        "'big' is a flag, read when the module runs, so it cannot decide what the "
        "constructor builds (a shape, a :when, a sub-model's argument, a const): define "
        "it with defconst"
    )


def test_a_flag_is_a_boolean():
    with pytest.raises(SourceError) as raised:
        compile_source("(defflag big 3)\n(defun forward (x) x)", "m.lisp", Options())
    assert (raised.value.span.line, raised.value.span.col) == (1, 14)
    assert raised.value.message == "a flag is true or false, got 3"


def test_a_flag_nothing_reads_is_warned_about():
    warnings = compile_module(
        "(defflag big false)\n(defun forward (x) x)", "m.lisp"
    ).warnings
    assert [(w.span.line, w.span.col, w.message) for w in warnings] == [
        (1, 10, "'big' is defined and never read; remove it")
    ]
