"""The interpreter calls a public method as the compiled module's does (issue 40, item 2):
called from outside with f32 tensors, a defun the program calls only with bf16 casts them
down at entry (docs/LANGUAGE.md, "Specializations"), in the interpreter as in the module, at
the top model and in a sub-model alike. The interpreter reads that decision from the
compiler's plan rather than guessing it from the calls it has evaluated so far, which made
its answer depend on what it ran before.

Every golden, example and difftest-corpus program runs its entry points in the compiled
module (cuda's code, on the CPU) with every method call inside recorded; then each public
method called there, and each entry point, is called again alone, with the recorded
arguments' floats as f32 (a bf16 one nudged off bf16's grid, which a cast at entry undoes;
booleans and integers as the callers pass them), on the module and on the interpreter: the
same dtypes and shapes, and for a golden or an example the same bits (the interpreter makes
the torch calls the module makes, in the same order) but where OWN_ORDER says why not; for
a corpus program the same bits where the interpreter's f64 evaluation shows no rounding
(its other values are test_difftest's, within its bounds).

A module-level function (a top-level defun the models share, written once) is no model's
method, so its calls are recorded too, and each function is called alone as a public
method is, with its first call's arguments (floats as f32) and keys, against the
interpreter's evaluation of a defun the function serves as its model's public method
(found in the compiler's plan): that method casts at entry what the function casts.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import torch

from cases import lisp
from conftest import load_module, seed_cpu
from interpret.test_interpret_examples import (
    REORDERED,
    compiled_and_interpreted,
    runs,
)
from models.test_public_methods import _SPECIALIZATION, EXAMPLES, ENTRIES, Recorder
from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.interpret.model import instances, method as method_name
from sx2torch.errors import SourceError
from targets.test_target_equivalence import FUNCTION, INPUTS, Floats, Ids

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))  # tools/ is beside the package, not in it
from tools.difftest import check, corpus  # noqa: E402

CORPUS = sorted((HERE / "difftest_corpus").glob("*.lisp"))

# The golden cases the target table gives no inputs, their entry points' arguments.
MORE = {
    "attention-mask": {"forward": (Floats((2, 2, 5, 4)),) * 3 + (Floats((2, 5)),)},
    "conv": {"forward": (Floats((2, 3, 8, 8)),)},
    "conv-transpose": {
        "forward": (Floats((2, 4, 5)), Floats((2, 2, 3, 3))),
        "up_gradient": (Floats((2, 4, 5)),),
    },
    "dropout": {"forward": (Floats((3, 4)),), "jitter": (Floats((3, 4)),)},
    "eager-attention": {
        "forward": (Floats((2, 5, 8)), Floats((2, 2, 5, 5))),
        "route": (Floats((2, 6)),),
    },
    "einsum": {
        "forward": (Floats((2, 3, 2, 4)),),
        "proj_gradient": (Floats((2, 3, 2, 4)),),
    },
    "fused-layer-norm": {"forward": (Floats((2, 8)),)},
    "generate-cache": {"forward": (Ids((2, 5), 64),)},
    "group-norm": {
        "forward": (Floats((2, 1, 9)),),
        "norm_gradient": (Floats((2, 1, 9)),),
    },
    "layer-library": {"forward": (Ids((2, 5), 32),)},
    "layer-library-conv": {"forward": (Floats((2, 3, 8, 8)),)},
    "smooth-functions": {
        "forward": (Floats((3, 4)),),
        "step_gradient": (Floats((3, 4)),),
    },
    "softmax-dtype": {"forward": (Floats((3, 8)),)},
    "stack-pad": {
        "forward": (Floats((2, 4, 6)),),
        "pad_gradient": (Floats((2, 4, 6)),),
    },
    "views": {
        "forward": (Floats((2, 5, 16)), Floats((5, 2)), Floats((5, 2))),
        "key_gradient": (Floats((2, 5, 16)), Floats((5, 2)), Floats((5, 2))),
    },
    "zero-d-lambdas": {"forward": (Ids((2, 5), 10),)},
}
GOLDEN = {**INPUTS, **MORE}
APART = {torch.float32: 2**-20, torch.bfloat16: 2**-6}
# (program, method) -> why the interpreter's value is not the module's bit for bit; there
# they agree within a few units in the last place of the largest element (APART)
OWN_ORDER = {
    **{(n, "forward"): "the sparse experts' rows added in a loop" for n in REORDERED},
    ("mamba", "forward"): "sx.linear_scan's doubling scan (f32 sums in another order) "
    "against the interpreter's step by step recurrence",
    # one bf16 ulp apart in a few elements, each as far from the f64 gradient as the other
    ("stack-pad", "pad_gradient"): "the bf16 gradient rounded in another order",
    ("views", "key_gradient"): "the bf16 gradient rounded in another order",
}


def _programs() -> list:
    """(source, run) for every golden, example and difftest corpus program."""
    paths = [lisp(name) for name in sorted(set(EXAMPLES) | set(GOLDEN))] + CORPUS
    return [(path, run) for path in paths for run in runs(path) or [None]]


def _entries(path: Path) -> tuple:
    """(the module's consts, {entry point: its arguments})."""
    name = path.stem
    if path.parent == HERE / "difftest_corpus":  # its header's methods and inputs
        case = corpus.load(path)
        rng = random.Random(case.seed)
        return {}, {
            method_name(m): check.inputs(names, rng)
            for m, names in case.methods.items()
        }
    if name in EXAMPLES:
        consts, inputs = EXAMPLES[name]
        args = inputs()
        entries = {"forward": args}
        entries.update({e: made(args) for e, made in ENTRIES.get(name, {}).items()})
        return consts, entries
    generator = torch.Generator().manual_seed(0)
    return {}, {
        method: [spec.make(generator, "cuda") for spec in specs]
        for method, specs in GOLDEN[name].items()
        # a specialization's own arguments are not from outside; a module-level function
        # (`module:NAME`, a top-level defun the models share) is called with its callers'
        # arguments, recorded as the entry points run (_record_functions)
        if " with " not in method and not method.startswith(FUNCTION)
    }


def _float(value) -> bool:
    return torch.is_tensor(value) and value.is_floating_point()


def _alone(value):
    """An argument as a caller from outside passes it: floats as f32. A bf16 value is
    moved off bf16's grid by less than half a unit in its last place: a cast down at
    entry gives back the callers' value, and a missing one shows in the numbers."""
    if not _float(value):
        return value
    if value.dtype == torch.bfloat16:
        return value.detach().float() * (1 + 2**-10)
    return value.detach().float()


def _leaves(value) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


@pytest.mark.parametrize(
    "source,run",
    _programs(),
    ids=lambda p: f"{p.parent.name}/{p.stem}" if isinstance(p, Path) else str(p),
)
def test_public_methods_alone_with_f32_agree(source, run):
    consts, entries = _entries(source)
    in_corpus = source in CORPUS
    try:
        unit, top, model = compiled_and_interpreted(source, run, consts)
    except SourceError:  # a corpus case the compiler refuses (test_front_end: alike)
        assert in_corpus
        return
    specialized = {method: of for of, method in _SPECIALIZATION.findall(unit.code)}
    classes = {
        type(m) for m in top.modules() if type(m).__module__ == type(top).__module__
    }
    recorder = Recorder(top, classes)
    functions = _functions(unit, model)
    called = _record_functions(type(top).forward.__globals__, functions)
    named = dict(top.named_modules())  # get_submodule("type") finds the builtin
    paths = {id(m): at for at, m in named.items()}
    calls = {}  # (sub-model path, public method) -> arguments, the first call's
    for entry, args in entries.items():
        at, _, method = entry.rpartition(".")
        if entry in specialized:
            continue
        try:
            with torch.no_grad():
                getattr(named[at], method)(*args)
        except RuntimeError:  # a corpus case's inputs that do not fit (ids past a
            # one-hot's classes): the interpreter refuses them too
            with pytest.raises(RuntimeError):
                model(_defun(model, at, method), *args)
            continue
        calls[at, method] = list(args)
    for instance, method, args, keys, _ in recorder.calls:
        if not keys:  # a call with keys: the entry point's with its defaults is checked
            calls.setdefault(
                (paths[id(instance)], specialized.get(method, method)), args
            )
    for (at, method), args in calls.items():
        _agree(
            partial(model.evaluate, _defun(model, at, method), keys={}),
            getattr(named[at], method),
            args,
            f"{source.stem} {run}: {at or type(top).__name__}.{method}",
            (source.stem, method) in OWN_ORDER,
            in_corpus,
        )
    _functions_agree(model, functions, called, source, run)


def _agree(interpreted, method, args: list, where: str, loose: bool, in_corpus: bool):
    """`method` called alone with `args`' floats as f32 computes what the interpreter
    does (`interpreted(args)`): the same dtypes and shapes, the same bits but where
    `loose` (OWN_ORDER says why not); in the corpus, where the f64 evaluation is exact.
    """
    alone = [_alone(a) for a in args]
    seed_cpu(1)  # dropout's and randn-like's draws alike
    with torch.no_grad():
        want = method(*[_clone(a) for a in alone])
    seed_cpu(1)
    got = interpreted(alone)
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        assert (g.dtype, g.shape) == (w.dtype, w.shape), where
    if in_corpus and not _exact(interpreted, alone, got):
        return  # its values are the difference test's (test_difftest), in bounds
    for g, w in zip(_leaves(got), _leaves(want)):
        if loose and w.dtype in APART:
            bound = APART[w.dtype] * w.abs().max().item()
            assert (g - w).abs().max() <= bound, where
        else:
            torch.testing.assert_close(
                g, w, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{where}: {m}"
            )


@dataclass(frozen=True)
class Function:
    """A module-level function (a top-level defun the models share, written once by
    sx2torch/plan/functions.py) as the interpreter evaluates it."""

    # the interpreter's name for a defun the function serves as its model's public
    # method, at an instance of the model: the plan casts at entry what the function
    # casts, so both are called alone as the public methods are
    defun: str
    keys: dict  # its Python keyword -> the source's &key


def _functions(unit, model) -> dict:
    """The module's functions by name."""
    plans, names = unit.plans, unit.names
    prefixes = {}  # model -> the state_dict prefix of its first instance
    for instance in instances(model.instance):
        prefixes.setdefault(instance.model.name, instance.prefix)
    found = {}
    for (of, defun), public in plans.public.items():
        code = public and plans.plans[public].code
        if code in plans.functions and of in prefixes:
            keys = {python: key for key, python in names.locals[code].keys.items()}
            found.setdefault(names.methods[code], Function(prefixes[of] + defun, keys))
    unserved = {names.methods[code] for code in plans.functions} - set(found)
    assert not unserved, f"functions serving no public method: {sorted(unserved)}"
    return found


def _record_functions(namespace: dict, functions: dict) -> dict:
    """Wraps each module-level function in the module's namespace, where its callers find
    it, to keep its first call: name -> (the function, its arguments, its keys)."""
    first: dict = {}
    for name in functions:

        def recorded(*args, _name=name, _original=namespace[name], **keys):
            first.setdefault(_name, (_original, args, keys))
            return _original(*args, **keys)

        namespace[name] = recorded
    return first


def _functions_agree(model, functions: dict, called: dict, source: Path, run):
    """Each module-level function, called alone as a public method is with its first
    call's arguments and keys, computes what the interpreter does of the defun it
    serves."""
    case = f"{source.stem} {run}"
    uncalled = sorted(set(functions) - set(called))
    assert not uncalled, f"{case}: functions no entry point calls: {uncalled}"
    for name, (original, args, keys) in called.items():
        function = functions[name]
        _agree(
            partial(
                model.evaluate,
                function.defun,
                keys={function.keys[k]: v for k, v in keys.items()},
            ),
            partial(original, **keys),
            args,
            f"{case}: the module's function {name}",
            (source.stem, name) in OWN_ORDER,
            source in CORPUS,
        )


def _defun(model, at: str, method: str) -> str:
    """The interpreter's name for the module's method `method` of sub-model `at`."""
    defuns = {method_name(d): d for d in model.at(at).model.defuns}
    return ".".join([*filter(None, [at]), defuns[method]])


def _exact(interpreted, args: list, got) -> bool:
    """The interpreter's f64 evaluation gives its value: no rounding happened."""
    wide = interpreted([a.double() if _float(a) else a for a in args], precision="f64")
    return all(
        torch.equal(g.double(), w.double())
        for g, w in zip(_leaves(got), _leaves(wide), strict=True)
    )


def _clone(value):
    return value.clone() if torch.is_tensor(value) else value


ISSUE = """
(defmodel block (&key (d 4))
  (defparam w (normal [d d]))
  (defun forward (x) (* x (sigmoid (matmul x w)))))
(defparam w (normal [4 4]))
(defparam blocks (stack 2 (block :d 4)))
(defun f1 (x) (* x (sigmoid x)))
(defun forward (x) (f1 (chain blocks (matmul x w))))
(defrun train :precision :bf16)
"""


def test_a_defun_called_only_with_bf16_casts_f32_down_whatever_ran_before():
    """The issue's case: `f1` and a block's `forward` are called only with bf16, so their
    one method casts f32 down at entry. The interpreter returned f32 from either called
    first, and bf16 once forward had run."""
    module = load_module(compile_source(ISSUE, "model.lisp"))
    torch.manual_seed(0)
    top = module.Model()
    model = interpret.load(ISSUE, state=top.state_dict())
    x = torch.randn(3, 4)
    for method in ["f1", "blocks.1.forward", "forward", "f1"]:
        path, _, name = method.rpartition(".")
        with torch.no_grad():
            want = getattr(top.get_submodule(path), name)(x.clone())
        got = model(method, x)
        assert want.dtype == torch.bfloat16 and got.dtype == want.dtype, method
        assert torch.equal(got, want), method
