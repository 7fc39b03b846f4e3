"""The interpreter: evaluates a SexpGPU source on tensors without generating code, each value
in the dtype the language's rules give it, for checking a model against its compiled module
(and, in tools/difftest, the compiler against it).

    model = interpret.load(source, "model.lisp", run="train", state=compiled.state_dict())
    y = model("forward", x)
    z = model("blocks.0.forward", x)  # a sub-model's public method, by its state_dict path

It runs on the compiler's front end: the reader, resolve and every check through the
plan's (trace, gradient, ranks, the policy: names, arities, keys, recursion, call depth,
shapes, kinds of values), so it accepts exactly the programs the compiler accepts, with
the same located diagnostics. It evaluates the program resolve made; of what the passes
decide it reads one thing: which arguments each public method casts down at entry (a
defun the program calls only with bf16 has one method, which casts f32 down, as the plan
decides once for every target), so that a method called from outside computes what the
module's does. No dtype, cast or specialization inside a method reaches its numbers.
"""

from __future__ import annotations

from typing import Optional

import torch

import sx2torch.compiler as compiler
from sx2torch.api import source_text
from sx2torch.errors import SourceError
from sx2torch.interpret import forms  # noqa: F401  (fills the evaluator's forms)
from sx2torch.interpret.evaluate import EvalError, Evaluator, Lam, without_rank
from sx2torch.interpret.model import Instance, build, instances, state_dict

__all__ = ["EvalError", "Interpreted", "check", "load"]


class Interpreted:
    """A model as the interpreter runs it: call a public defun by name on tensors."""

    def __init__(self, checked, consts: dict, state: Optional[dict]):
        self.program = checked.program
        self.precision = checked.precision
        self.instance = build(self.program, self.program.top, consts, state)
        self.entry = entry_casts(checked)
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
        rounded_once=False,
    ):
        """`method`: a defun of the top model, else `PATH.DEFUN`, one of the sub-model whose
        state_dict keys start with `PATH.` (`blocks.0.forward`);
        `precision` "f64" widens every dtype the rules give (is f32 arithmetic exact?);
        `detach=False` keeps the autograd graph to the parameters (`tensors()`);
        `rounded_once`: a bf16 function (ops.FUNCTIONS) is its f32 value rounded once, as
        the rules say and a GPU's kernel and the held targets compute it, where by default
        it is torch's CPU kernel on bf16, which cuda's code gets when it runs on the CPU.
        """
        instance, name = self.instance, method
        if method not in instance.model.defuns:  # a defun's name may hold a dot (`x.`)
            path, _, name = method.rpartition(".")
            instance = self.at(path)
        evaluator = Evaluator(
            instance, precision or self.precision, self.training, rounded_once
        )
        down = self.entry.get((instance.model.name, name), ())
        with torch.enable_grad():
            given = [without_rank(a) for a in args]
            value = evaluator.enter(name, given, keys or {}, down)
        if not detach:
            return value.t if isinstance(value, Lam) else value
        return _plain(value)

    def at(self, path: str) -> Instance:
        """The sub-model instance whose state_dict keys start with `path.` (the top one for
        ""), as `module.get_submodule(path)` finds the compiled one."""
        for instance in instances(self.instance):
            if instance.prefix == (path + "." if path else ""):
                return instance
        raise EvalError(f"the model has no sub-model '{path}'")

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
    return Interpreted(check(text, filename, run), consts or {}, state)


def check(text, filename: str = "model.lisp", run: Optional[str] = None):
    """The compiler's front end over `text`: its program, chosen run and plans, or the
    compiler's diagnostic, located in `filename`."""
    text = source_text(text, filename)
    checked = compiler.Unit(text, filename, compiler.Options(run=run, target=DECIDING))
    try:
        return compiler.run(checked, until=CHECKED)
    except SourceError as error:
        raise error.located(filename, text) from None


# The last pass whose checks the interpreter takes: the policy refuses what no dtype fits
# (a number carried through a loop, float indices), and the plan decides the public
# methods; of the passes' decisions only the entry casts are read (`entry_casts`), the
# evaluator makes the others from the rules.
CHECKED = "plan"
# The held target on whose plans the compiler decides the methods for every target
# (sx2torch/plan/methods.py's DECIDING): which are public, which cast at entry.
DECIDING = "cpu"


def entry_casts(checked) -> dict:
    """(model, defun) -> the arguments its public method casts down at entry, as the plan
    decided them (docs/LANGUAGE.md, "Specializations"): those of the method serving the
    specialization named as the source names the defun."""
    plans = checked.plans.plans
    return {
        key: tuple(plans[plans[public].code].entry)
        for key, public in checked.plans.public.items()
        if public is not None
    }


def _plain(value):
    if isinstance(value, Lam):
        value = value.t
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value.detach() if isinstance(value, torch.Tensor) else value
