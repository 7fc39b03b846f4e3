"""The interpreter runs on the compiler's front end: every program the compiler compiles it
accepts, every one the compiler rejects it rejects with the compiler's diagnostic, at the
same place, whichever entry point reads it (`interpret.load`, `sx2torch run`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from cases import EXAMPLES, GOLDEN
from conftest import load_module
from sx2torch import cli, interpret
from sx2torch.compiler import Options, compile_module
from sx2torch.errors import SourceError

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))  # tools/ is beside the package, not in it
from tools import hostile  # noqa: E402

PROGRAMS = sorted(
    [
        *GOLDEN.glob("*.lisp"),
        *EXAMPLES.glob("*.lisp"),
        *(HERE / "difftest_corpus").glob("*.lisp"),
    ]
)


def _ends(call) -> tuple:
    try:
        call()
    except SourceError as error:
        return (error.line, error.column, error.message)
    return "accepted"


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_interpreter_accepts_what_every_pass_of_the_compiler_accepts(path):
    """Through every pass, the policy and emission included: nothing the interpreter's
    checks let through is refused later (interpret.check is the front end that load runs;
    it does not draw a model's parameters, which the examples' defaults make large)."""
    text = path.read_text("utf-8")
    for run in [None, *_runs(text, path.name)]:
        compiled = _ends(lambda: compile_module(text, path.name, Options(run=run)))
        assert _ends(lambda: interpret.check(text, path.name, run)) == compiled


def _runs(text: str, name: str) -> list:
    """The file's defruns, none where it is refused."""
    try:
        return [r.name for r in interpret.check(text, name).program.runs]
    except SourceError:
        return []


# Programs the interpreter evaluated, or failed on inside, where the compiler refused them
# (issue 40): recursion, a deep call chain, &rest, keywords given twice or unknown, too
# many arguments, an empty let body, a dtype it does not know; and one the compiler folds.
REFUSED = {
    "(defun f (x) (f x))\n(defun forward (x) (f x))\n": (1, 15, "defun 'f' calls itself (f -> f); recursion is not supported"),
    "(defun forward (x) (cast x :f64))\n": (1, 28, "expected :f32 or :bf16 or :i64 or :i32 or :bool, got :f64"),
    "".join(f"(defun c{i} (x) (c{i + 1} x))\n" for i in range(65))
    + "(defun c65 (x) x)\n(defun forward (x) (c0 x))\n": (64, 17, "calls nested more than 64 defuns deep"),
    "(defun g (x &rest r) x)\n(defun forward (x) (g x))\n": (2, 20, "wrong number of arguments: expected (g x &rest r), got 1"),
    "(defun g (x &key (s 1.0)) (* x s))\n(defun forward (x) (g x :s 1.0 :s 2.0))\n": (2, 32, ":s given twice"),
    "(defun g (x &key (s 1.0)) (* x s))\n(defun forward (x) (g x :t 1.0))\n": (2, 25, "unknown keyword :t for 'g' (known: :s)"),
    "(defun g (x) x)\n(defun forward (x) (g x x))\n": (2, 20, "wrong number of arguments: expected (g x), got 2"),
    "(defun forward (x) (let ((y x))))\n": (1, 20, "wrong number of arguments: expected (let ((NAME EXPR) ...) BODY ...), got 1"),
}  # fmt: skip


@pytest.mark.parametrize("text", REFUSED, ids=range(len(REFUSED)))
def test_run_and_load_give_the_compilers_diagnostic(text, tmp_path, capsys):
    where = REFUSED[text]
    assert _ends(lambda: compile_module(text, "m.lisp")) == where
    assert _ends(lambda: interpret.load(text, "m.lisp")) == where
    path = _run(tmp_path, text)
    line, column, message = where
    assert capsys.readouterr().err.startswith(
        f"{path}:{line}:{column}: error: {message}\n"
    )


def _run(tmp_path, text: str):
    """`sx2torch run` of `text` on an input [2 4], which must end in exit 1; its path."""
    path, inputs = tmp_path / "m.lisp", tmp_path / "x.pt"
    path.write_text(text)
    torch.save(torch.randn(2, 4), inputs)
    assert cli.main(["run", str(path), "--input", f"x={inputs}"]) == 1
    return path


def test_a_function_of_a_literal_is_folded_as_the_compiler_folds_it(tmp_path):
    """`(log 10000.0)` is a number, as Python's math computes it in f64."""
    text = "(defun forward (x) (* x (log 10000.0)))\n"
    x = torch.randn(2, 4)
    got = interpret.load(text, "m.lisp")("forward", x)
    assert torch.equal(got, x * 9.210340371976184)


def test_run_locates_a_form_that_fails_on_the_given_inputs(tmp_path, capsys):
    """The inputs do not fit the program (as the compiled module would fail): the form
    that failed, not an internal error."""
    path, inputs = tmp_path / "m.lisp", tmp_path / "x.pt"
    path.write_text(
        "(defparam w (normal [3 3]))\n(defun forward (x)\n  (matmul x w))\n"
    )
    torch.save(torch.randn(2, 4), inputs)
    assert cli.main(["run", str(path), "--input", f"x={inputs}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"{path}:3:3: error: this form fails on the given inputs: RuntimeError: mat1 and mat2 shapes cannot be multiplied"
    )
    with pytest.raises(RuntimeError):
        torch.randn(2, 4) @ torch.randn(3, 3)


def test_hostile_sources_end_alike_at_every_entry_point(tmp_path):
    """A deterministic slice of tools/hostile: every entry point ends in success, a
    located SourceError or a UsageError, and the interpreter ends as the compiler does.
    """
    rng = __import__("random").Random(40)
    findings = []
    for _ in range(200):
        text = hostile.make(rng)
        for entry, (kind, finding) in hostile.check(text, tmp_path).items():
            if finding:
                findings.append((entry, finding, text))
    assert findings == []


# Programs the compiler accepts whose module fails when it runs on an input [2 4]: a
# gradient's Y that the input makes a tensor with axes, a read of a parameter layer 0 does
# not make. `run` said "internal compiler error"; now the form, as the module fails.
FAIL_WHEN_RUN = [
    (
        "(defparam w (normal [4]))\n(defun forward (x)\n"
        "  (gradient (gradient (sum (* x w)) x) w))\n",
        "3:3",
        "ValueError: gradient needs a scalar Y, got a tensor of shape [2, 4]",
        ValueError,
    ),
    (
        "(defmodel blk (&key (idx 0))\n"
        "  (defparam gate (normal [4]) :when (in idx [2]))\n"
        "  (defun forward (x) (if (in idx [0 2]) (* x gate) x)))\n"
        "(defparam blocks (stack (i 3) (blk :idx i)))\n"
        "(defun forward (x) (for (i layer blocks) ((h x)) (layer h)))\n",
        "3:41",
        "NotMade: parameter 'gate' is not made here: its :when is false",
        AttributeError,
    ),
]


@pytest.mark.parametrize(
    "text, where, message, raised", FAIL_WHEN_RUN, ids=["y", "when"]
)
def test_run_locates_a_form_the_module_fails_on(
    text, where, message, raised, tmp_path, capsys, build
):
    path = _run(tmp_path, text)
    assert capsys.readouterr().err.startswith(
        f"{path}:{where}: error: this form fails on the given inputs: {message}"
    )
    module, _ = build(text, "m.lisp")
    with pytest.raises(raised):
        module.M()(torch.randn(2, 4))


def test_the_interpreter_computes_golden_arithmetic_as_the_module(build):
    """mod on a layer index, `**` on a tensor and an n-ary `-` of tensors: the interpreter
    failed on the first two (torch.remainder of two ints, no op '**') and took only the
    first two operands of the third."""
    text = (GOLDEN / "arithmetic.lisp").read_text()
    module, _ = build(text, "arithmetic.lisp")
    model = module.Arithmetic()
    x = torch.randn(2, 4)
    oracle = interpret.load(text, "arithmetic.lisp", state=model.state_dict())
    assert torch.equal(oracle("forward", x), model(x))


EXPERTS = """(defparam gate-up (normal [2 4 4]))
(defparam down (normal [2 4 2]))
(defun forward (x index weights)
  (sparse-experts x index weights gate-up down))
"""


@pytest.mark.parametrize("chosen", [2, -1])
def test_an_expert_index_outside_the_experts_fails_as_the_module_does(chosen):
    """The module's F.one_hot refuses an expert index outside [0, 2); the interpreter
    skipped the row, as no expert matched it, and gave a value the module never does."""
    x, weights = torch.randn(3, 4), torch.ones(3, 1)
    index = torch.tensor([[0], [chosen], [1]])
    module = load_module(compile_module(EXPERTS, "m.lisp").code).M()
    model = interpret.load(EXPERTS, "m.lisp", state=module.state_dict())
    with pytest.raises(RuntimeError, match="Class values must be"):
        module(x, index, weights)
    with pytest.raises(RuntimeError, match="expert index"):
        model("forward", x, index, weights)
    assert model("forward", x, index.clamp(0, 1), weights).shape == (3, 4)
