"""The differential campaign: random programs, every oracle, counts per oracle and target.

    python -m tools.difftest --n 50000 --seed 0 [--out difftest-out] [--minimize]

Each program is compiled for `cuda` and one held target in turn (`metal`, `cpu`), so the
three share the programs; `--all-targets` compiles every program for all three. Counts go
to OUT/counts.json as the campaign runs; each failing program to OUT/fail-SEED.lisp, with
its minimized form beside it when --minimize is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from tools.difftest import check, corpus, generate, minimize


def targets_for(seed: int, every: bool) -> tuple:
    return check.TARGETS if every else ("cuda", ("metal", "cpu")[seed % 2])


def one(seed: int, every: bool = False) -> tuple:
    """(source, methods, outcome) of the program drawn from `seed`."""
    source, methods = generate.program(seed)
    try:
        outcome = check.run(
            source,
            methods,
            seed,
            check.exact_ops(source),
            twice=seed % 10 == 0,
            targets=targets_for(seed, every),
        )
    except Exception as error:  # noqa: BLE001: a bug of the tester's, reported as one
        outcome = check.Outcome()
        outcome.note("checker", "-", False, f"{type(error).__name__}: {error}")
    return source, methods, outcome


def campaign(n: int, seed: int, out: Path, every: bool, reduce: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    counts: Counter = Counter()
    signatures: Counter = Counter()
    started = time.monotonic()
    for tried in range(1, n + 1):
        s = seed + tried - 1
        source, methods, outcome = one(s, every)
        counts["programs"] += 1
        counts["methods compared exactly"] += sum(outcome.exact)
        counts["methods compared to a bound"] += len(outcome.exact) - sum(outcome.exact)
        for (oracle, where), result in outcome.counts.items():
            counts[f"{oracle} {where.split(':')[0]} {result}"] += 1
        real = [f for f in outcome.failures if f[0] != "diagnostic"]
        if real:
            counts["failing programs"] += 1
            _save(out, s, source, methods, real, reduce)
            for oracle, where, message in real:
                signatures[f"{oracle} {where}"] += 1
        if tried % 50 == 0 or tried == n:
            rate = tried / (time.monotonic() - started)
            report = {
                "seed": seed,
                "tried": tried,
                "programs_per_s": round(rate, 2),
                "counts": dict(sorted(counts.items())),
                "failures": dict(signatures.most_common()),
            }
            (out / "counts.json").write_text(json.dumps(report, indent=1) + "\n")
            print(
                f"{tried} programs ({rate:.2f}/s), {counts['failing programs']} failing",
                flush=True,
            )
    return 1 if counts["failing programs"] else 0


def _save(
    out: Path, seed: int, source: str, methods: dict, failures: list, reduce: bool
):
    text = corpus.header(seed, methods, failures) + source
    (out / f"fail-{seed}.lisp").write_text(text)
    if reduce:
        small = minimize.minimize(source, methods, seed, failures[0][0])
        (out / f"min-{seed}.lisp").write_text(
            corpus.header(seed, minimize.defined(small, methods), failures) + small
        )


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.difftest", description=__doc__
    )
    parser.add_argument("--n", type=int, default=1000, help="programs (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--out", type=Path, default=Path("difftest-out"))
    parser.add_argument("--all-targets", action="store_true")
    parser.add_argument("--minimize", action="store_true", help="minimize each failure")
    args = parser.parse_args(argv)
    return campaign(args.n, args.seed, args.out, args.all_targets, args.minimize)


if __name__ == "__main__":
    sys.exit(main())
