"""The interpreter: evaluates a SexpGPU source on tensors without generating code, each value
in the dtype the language's rules give it, for checking a model against its compiled module
(and, in tools/difftest, the compiler against it).

    model = interpret.load(source, "model.lisp", run="train", state=compiled.state_dict())
    y = model("forward", x)

It runs on the compiler's front end: the reader, resolve and every check through the
policy's (trace, gradient, ranks and the policy: names, arities, keys, recursion, call
depth, shapes, kinds of values), so it
accepts exactly the programs the compiler accepts, with the same located diagnostics. It
evaluates the program resolve made; nothing the passes decide (a dtype, a cast, a
specialization) reaches its numbers.
"""

from __future__ import annotations

from typing import Optional

import torch

import sx2torch.compiler as compiler
from sx2torch.api import source_text
from sx2torch.errors import SourceError
from sx2torch.interpret import forms  # noqa: F401  (fills the evaluator's forms)
from sx2torch.interpret.evaluate import (
    EvalError,
    Evaluator,
    Lam,
    entry_casts,
    signature,
    without_rank,
)
from sx2torch.interpret.model import build, state_dict

__all__ = ["EvalError", "Interpreted", "check", "load"]


class Interpreted:
    """A model as the interpreter runs it: call a public defun by name on tensors."""

    def __init__(self, program, precision: str, consts: dict, state: Optional[dict]):
        self.program = program
        self.precision = precision
        self.instance = build(program, program.top, consts, state)
        self.calls: dict = {}  # the calls the program made, as Evaluator.calls says
        # dropout is active, as in a new nn.Module, until eval()
        self.training = True
        for tensor in state_dict(self.instance).values():
            tensor.requires_grad_(tensor.is_floating_point())

    def __call__(self, method: str, *args, **keys):
        return self.evaluate(method, args, keys)

    def evaluate(
        self,
        method: str,
        args,
        keys=None,
        precision=None,
        detach=True,
        entry=True,
        rounded_once=False,
    ):
        """`precision` "f64" widens every dtype the rules give (is f32 arithmetic exact?);
        `detach=False` keeps the autograd graph to the parameters (`tensors()`);
        `entry=False` reads no argument cast down at entry (see `casts_at_entry`);
        `rounded_once`: a bf16 function (ops.FUNCTIONS) is its f32 value rounded once, as
        the rules say and a GPU's kernel and the held targets compute it, where by default
        it is torch's CPU kernel on bf16, which cuda's code gets when it runs on the CPU.
        """
        keys = keys or {}
        # another precision (is the arithmetic exact?) casts at entry as the run does
        calls = self.calls
        if precision not in (None, self.precision):
            calls = {key: list(made) for key, made in calls.items()}
        evaluator = Evaluator(
            self.instance,
            precision or self.precision,
            self.training,
            calls,
            rounded_once,
        )
        with torch.enable_grad():
            given = [without_rank(a) for a in args]
            value = evaluator.enter(method, given, keys, entry=entry)
        if not detach:
            return value.t if isinstance(value, Lam) else value
        return _plain(value)

    def casts_at_entry(self, method: str, args) -> list:
        """The arguments of `method` called from outside that the rule casts down at entry
        (the program calls it only with them bf16), given the calls evaluated so far. Where
        the defun's f32 method also computes its bf16 callers' specialization (their code is
        the same once written out), that method is the public one and casts nothing: which
        of the two the compiler writes depends on the code, so `evaluate(entry=False)`
        gives the other reading."""
        calls = self.calls.get((self.instance.model.name, method), [])
        return entry_casts(signature(args), calls)

    def eval(self) -> "Interpreted":
        """Dropout is the identity from now on, as after nn.Module.eval()."""
        self.training = False
        return self

    def tensors(self) -> dict:
        """The parameters' tensors themselves, which autograd differentiates to."""
        return state_dict(self.instance)

    def state_dict(self) -> dict:
        return {k: v.detach() for k, v in state_dict(self.instance).items()}


def load(
    text: str,
    filename: str = "model.lisp",
    run: Optional[str] = None,
    consts: Optional[dict] = None,
    state: Optional[dict] = None,
) -> Interpreted:
    """The top model of `text`, under the chosen defrun's precision (the first; `:f32` without
    one); parameters from `state` (state_dict keys), else drawn in source order from torch's
    generator as the generated module draws them."""
    checked = check(text, filename, run)
    return Interpreted(checked.program, checked.precision, consts or {}, state)


def check(text, filename: str = "model.lisp", run: Optional[str] = None):
    """The compiler's front end over `text`: its program and chosen run, or the compiler's
    diagnostic, located in `filename`."""
    text = source_text(text, filename)
    checked = compiler.Unit(text, filename, compiler.Options(run=run))
    try:
        return compiler.run(checked, until=CHECKED)
    except SourceError as error:
        raise error.located(filename, text) from None


# The last pass whose checks the interpreter takes: the policy refuses what no dtype fits
# (a number carried through a loop, float indices); its decisions (`unit.lowered`) are
# never read here, the evaluator makes them from the rules.
CHECKED = "policy"


def _plain(value):
    if isinstance(value, Lam):
        value = value.t
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value.detach() if isinstance(value, torch.Tensor) else value
