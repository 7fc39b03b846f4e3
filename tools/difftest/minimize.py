"""A smaller program with the same failure: fuzz's reduction, with the oracles as the test."""

from __future__ import annotations

from sx2torch.errors import SourceError
from tools import fuzz
from tools.difftest import check


def fails(source: str, methods: dict, seed: int, oracle: str, targets) -> bool:
    if oracle == "compile":  # an internal error: compiling is the whole test
        return _crashes(source, targets or check.TARGETS)
    outcome = check.run(
        source, methods, seed, _exact(source), twice=False, targets=targets
    )
    return any(f[0] == oracle for f in outcome.failures)


def minimize(source: str, methods: dict, seed: int, oracle: str, targets=None) -> str:
    """`source` reduced while `oracle` still fails on it (with the same seed's data)."""
    if not fails(source, methods, seed, oracle, targets):
        return source
    small = fuzz.reduce_with(
        source.encode(),
        lambda trial: fails(trial.decode(), methods, seed, oracle, targets),
    )
    return small.decode()


def _crashes(source: str, targets) -> bool:
    for target in targets:
        try:
            check.compile_module(source, target)
        except SourceError:
            return False
        except Exception:  # noqa: BLE001: the finding
            return True
    return False


def _exact(source: str) -> bool:
    from tools.difftest.campaign import exact_ops

    return exact_ops(source)
