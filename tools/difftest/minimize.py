"""A smaller program with the same failure: fuzz's reduction, with the oracles as the test."""

from __future__ import annotations

import random
import re
import traceback
from pathlib import Path

from sx2torch import interpret
from sx2torch.errors import SourceError
from tools import fuzz
from tools.difftest import check


def fails(source: str, methods: dict, seed: int, oracle: str, targets) -> bool:
    """`oracle` fails on `source`; "compile:KeyError@rules.py:_op": compiling raises a
    KeyError there."""
    if oracle.startswith("compile"):  # an internal error: compiling is the whole test
        crash = _crashes(source, targets or check.TARGETS) == oracle
        return crash and _well_formed(source, methods, seed)
    outcome = check.run(
        source, defined(source, methods), seed, check.exact_ops(source), False, targets
    )
    return any(f[0] == oracle for f in outcome.failures)


def defined(source: str, methods: dict) -> dict:
    """The methods a reduced source still defines (a reduction may drop `helper`)."""
    return {m: a for m, a in methods.items() if re.search(rf"\(defun {m} ", source)}


def minimize(source: str, methods: dict, seed: int, oracle: str, targets=None) -> str:
    """`source` reduced while `oracle` still fails on it (with the same seed's data);
    for "compile", while compiling raises the same kind of exception."""
    if oracle == "compile":
        oracle = _crashes(source, targets or check.TARGETS) or oracle
    if not fails(source, methods, seed, oracle, targets):
        return source
    small = fuzz.reduce_with(
        source.encode(),
        lambda trial: fails(trial.decode(), methods, seed, oracle, targets),
    )
    return small.decode()


def _crashes(source: str, targets) -> str:
    """ "compile:ERROR" for the first internal error compiling `source` raises, else ""."""
    for target in targets:
        try:
            check.compile_module(source, target)
        except SourceError:
            return ""
        except Exception as error:  # noqa: BLE001: the finding
            where = traceback.extract_tb(error.__traceback__)[-1]
            return f"compile:{type(error).__name__}@{Path(where.filename).name}:{where.name}"
    return ""


def _well_formed(source: str, methods: dict, seed: int) -> bool:
    """The interpreter evaluates every method: the program is one the rules define."""
    rng = random.Random(seed)
    try:
        model = interpret.load(source, "model.lisp")
        for method, names in methods.items():
            model(method, *check.inputs(names, rng))
    except Exception:  # noqa: BLE001: not a program of the language
        return False
    return True
