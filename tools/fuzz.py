"""Mutation fuzzing of the sx2torch command line, in process.

    python -m tools.fuzz --n 100000 [--seed 0] [--crashes fuzz-crashes] [--limit 10]
    python -m tools.fuzz --reduce CRASH.lisp      # a smaller input with the same finding

Each input is an example or golden source with a few random edits (tokens and
brackets inserted, deleted, swapped or replaced; odd bytes injected; pieces of
other files spliced in). It is compiled as `sx2torch FILE` would, and must end
with exit 0 and an output that compiles and black leaves alone, or exit 1 and a
located diagnostic: never a traceback, an "internal compiler error", a hang or
another exit code. Crashing inputs are saved to the crashes folder.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import random
import re
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Optional

import black

from sx2torch import cli

ROOT = Path(__file__).resolve().parents[1]
SEED_DIRS = (ROOT / "examples", ROOT / "golden")
DIAGNOSTIC = re.compile(r"^[^:]+:\d+:\d+: error: ")
TOKEN = re.compile(
    rb'"(?:[^"\\]|\\.)*"|;[^\n]*|[()\[\]]|[^\s()\[\]";]+|\s+|.', re.DOTALL
)
ODD = [
    b"(", b")", b"[", b"]", b"()", b"[]", b'"', b"'", b":", b";", b"\\", b"-", b"0", b"-1", b"0.5", b"-0.0",
    b"1e999", b"1e-999", b"9" * 30, b"nan", b"inf", b"1_0", b"true", b"false", b"nil", b"t", b"&key", b"x",
    b"forward", b"defun", b"defmodel", b"defparam", b"defconst", b"defrun", b"let", b"with-numerics", b"cast",
    b"gradient", b"chain", b"stack", b":f32", b":bf16", b":high", b":precision", b":sensitivity", b":axes",
    b":keepdims", b":out", b"self", b"torch", b"__import__", b"class", b"lambda", b"x-y", b"x_y", b'"a\\"b"',
    b'"""', b"\x00", b"\xff", b"\xc3", b"\xef\xbb\xbf", "\u2028".encode(), "\u00a0".encode(), b"\t", b"\r", b"\n",
    b"\x1b[31m", b" ",
]  # fmt: skip


class Hang(BaseException):
    """Raised by the alarm: not an Exception, so the CLI cannot report it as a diagnostic."""


def seeds() -> list:
    return [
        p.read_bytes()
        for d in SEED_DIRS
        if d.is_dir()
        for p in sorted(d.glob("*.lisp"))
    ]


def tokens(data: bytes) -> list:
    return TOKEN.findall(data)


def mutate(data: bytes, rng: random.Random, pool: list, others: list = ()) -> bytes:
    """1 to 4 random edits of `data`'s tokens (or bytes)."""
    parts = tokens(data) or [b""]
    for _ in range(rng.randint(1, 4)):
        i, j = sorted(rng.randrange(len(parts) + 1) for _ in range(2))
        kind = rng.randrange(9)
        if kind == 0 and parts:
            del parts[min(i, len(parts) - 1)]
        elif kind == 1:
            del parts[i : min(j, i + 8)]
        elif kind == 2:
            parts.insert(i, rng.choice(pool))
        elif kind == 3 and parts:
            parts[min(i, len(parts) - 1)] = rng.choice(pool)
        elif kind == 4 and j < len(parts):
            parts[i], parts[j] = parts[j], parts[i]
        elif kind == 5:
            parts[i:j] = parts[i:j] * 2 if j - i < 50 else parts[i:j]
        elif kind == 6:
            parts[i:j] = [b"("] + parts[i:j] + [b")"]
        elif kind == 7:
            text = b"".join(parts)
            k = rng.randrange(len(text) + 1)
            parts = [text[:k], bytes([rng.randrange(256)]), text[k:]]
        elif kind == 8 and others:
            donor = tokens(rng.choice(others))
            a = rng.randrange(len(donor) + 1)
            parts[i:j] = donor[a : a + rng.randint(1, 40)]
    return b"".join(parts)


def problem(rc: int, out: str, err: str) -> Optional[str]:
    """What is wrong with one run of the CLI, or None."""
    if "Traceback" in err or "internal compiler error" in err:
        return err.strip().splitlines()[-1][:300]
    if rc == 1:
        return (
            None
            if DIAGNOSTIC.match(err)
            else f"exit 1 without a located diagnostic: {err[:200]!r}"
        )
    if rc != 0:
        return f"exit {rc}: {err[:200]!r}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the contract: it compiles without warnings
            compile(out, "<generated>", "exec")
    except (SyntaxError, ValueError, Warning) as error:
        return f"the output does not compile cleanly: {error}"
    if black.format_str(out, mode=black.Mode()) != out:
        return "the output is not black-stable"
    return None


def run_cli(path: Path, data: bytes, limit_s: float = 10.0) -> tuple:
    """(exit code, stdout, stderr) of `sx2torch PATH` on `data`; a hang raises Hang."""
    path.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()

    def alarm(signum, frame):
        raise Hang()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main([str(path)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return rc, out.getvalue(), err.getvalue()


def check(path: Path, data: bytes, limit_s: float = 10.0) -> tuple:
    """("ok" | "diagnostic" | "crash", what went wrong or None) for one input."""
    try:
        rc, out, err = run_cli(path, data, limit_s)
    except Hang:
        return "crash", f"no answer within {limit_s} s"
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # an exception that escaped the CLI is the finding
        return "crash", f"escaped the CLI: {type(error).__name__}: {error}"
    finding = problem(rc, out, err)
    return ("crash" if finding else "ok" if rc == 0 else "diagnostic"), finding


def campaign(n: int, seed: int, crashes: Path, limit_s: float) -> int:
    rng = random.Random(seed)
    corpus = seeds()
    pool = sorted(
        {t for data in corpus for t in tokens(data) if len(t) < 40} | set(ODD)
    )
    found: dict[str, str] = {}
    counts = {"ok": 0, "diagnostic": 0, "crash": 0}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "input.lisp"
        for tried in range(1, n + 1):
            data = mutate(rng.choice(corpus), rng, pool, corpus)
            kind, finding = check(path, data, limit_s)
            counts[kind] += 1
            if finding:
                name = hashlib.sha1(data).hexdigest()[:12]
                crashes.mkdir(parents=True, exist_ok=True)
                (crashes / f"crash-{name}.lisp").write_bytes(data)
                (crashes / f"crash-{name}.txt").write_text(
                    finding + "\n", encoding="utf-8"
                )
                signature = _signature(finding)
                if signature not in found:
                    found[signature] = name
                    print(f"[{tried}] new crash {name}: {finding}", flush=True)
            if tried % 1000 == 0 or tried == n:
                rate = tried / (time.monotonic() - started)
                print(
                    f"{tried} inputs tried ({rate:.0f}/s): {counts}, {len(found)} distinct crashes",
                    flush=True,
                )
    print(
        f"done: {n} inputs tried (seed {seed}), {counts['crash']} crashing, {len(found)} distinct; saved in {crashes}"
    )
    return 1 if found else 0


def reduce(data: bytes, limit_s: float = 10.0) -> bytes:
    """A smaller input with the same finding."""
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "input.lisp"
        wanted = _signature(check(path, data, limit_s)[1])
        return reduce_with(
            data, lambda trial: _signature(check(path, trial, limit_s)[1]) == wanted
        )


def reduce_with(data: bytes, keeps) -> bytes:
    """A smaller input that `keeps(input)` still accepts: forms deleted, or replaced by one
    of their parts, until no such edit is accepted."""
    parts = [t for t in tokens(data) if not t.isspace() and not t.startswith(b";")]
    changed = True
    while changed:
        changed = False
        for start, end in sorted(_forms(parts), key=lambda f: f[0] - f[1]):
            for child in [(start, start)] + [
                c for c in _forms(parts) if start < c[0] and c[1] < end
            ]:
                trial = parts[:start] + parts[child[0] : child[1]] + parts[end:]
                if keeps(b" ".join(trial)):
                    parts, changed = trial, True
                    break
            if changed:
                break
    return re.sub(rb"([(\[]) | ([)\]])", rb"\1\2", b" ".join(parts)) + b"\n"


def _forms(parts: list) -> list:
    """(start, end) of every atom and bracketed form among the tokens."""
    found, opened = [], []
    for i, part in enumerate(parts):
        if part in (b"(", b"["):
            opened.append(i)
        elif part in (b")", b"]"):
            if opened:
                found.append((opened.pop(), i + 1))
        else:
            found.append((i, i + 1))
    return found


def _signature(finding: Optional[str]) -> Optional[str]:
    return re.sub(r"\d+", "N", finding)[:120] if finding else None


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.fuzz", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--n", type=int, default=10000, help="inputs to try (default 10000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--crashes",
        type=Path,
        default=Path("fuzz-crashes"),
        help="folder for crashing inputs",
    )
    parser.add_argument(
        "--limit",
        type=float,
        default=10.0,
        help="seconds one input may take (default 10)",
    )
    parser.add_argument(
        "--reduce",
        type=Path,
        help="print a smaller input with the same finding as this one",
    )
    args = parser.parse_args(argv)
    if args.reduce:
        sys.stdout.buffer.write(reduce(args.reduce.read_bytes(), args.limit))
        return 0
    return campaign(args.n, args.seed, args.crashes, args.limit)


if __name__ == "__main__":
    sys.exit(main())
