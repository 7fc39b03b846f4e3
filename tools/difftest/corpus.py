"""The corpus: every failure the tester found, as a source whose header says how to replay it.

    ;; difftest seed=7 methods=forward(x,ids);helper(x)
    ;; found: value cuda:forward: max |diff| 2 ...
    ;; known: the fix is not on this branch yet (the test expects the failure)
    ;; expect: no-internal-error       (only the compile oracle counts: a diagnostic is fine)

`replay` runs every oracle on every target with the header's seed; tests/interpret/test_difftest.py
replays each file, a `known:` one as a strict xfail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tools.difftest import check

HEADER = re.compile(r";; difftest seed=(\d+) methods=(\S+)")


@dataclass
class Case:
    path: Path
    source: str
    seed: int
    methods: dict
    known: Optional[str]
    expect: Optional[str]  # "no-internal-error": only the compile oracle counts


def header(seed: int, methods: dict, failures: list) -> str:
    shown = ";".join(f"{m}({','.join(a)})" for m, a in methods.items())
    lines = [f";; difftest seed={seed} methods={shown}"]
    lines += [f";; found: {o} {w}: {m[:160]}" for o, w, m in failures[:3]]
    return "\n".join(lines) + "\n"


def load(path: Path) -> Case:
    text = path.read_text()
    match = HEADER.search(text)
    methods = {}
    for part in match.group(2).split(";"):
        name, _, args = part.partition("(")
        methods[name] = [a for a in args.rstrip(")").split(",") if a]
    known = re.search(r";; known: (.*)", text)
    expect = re.search(r";; expect: (\S+)", text)
    return Case(
        path,
        text,
        int(match.group(1)),
        methods,
        known and known.group(1),
        expect and expect.group(1),
    )


def replay(case: Case) -> list:
    """The failures of every oracle on every target (diagnostics included)."""
    outcome = check.run(
        case.source, case.methods, case.seed, check.exact_ops(case.source), True
    )
    return outcome.failures
