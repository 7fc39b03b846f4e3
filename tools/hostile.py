"""Hostile sources through every entry point, in process.

    python -m tools.hostile --n 100000 [--seed 0] [--found hostile-found] [--limit 10]

Each input is a small valid model with hostile parts put in (deep nesting, huge and odd
numbers, unicode, names that shadow Python's and torch's, recursion and deep call chains,
zero and negative sizes, NaN and inf literals, wrong keywords and arities, forms missing
parts), or bracket soup. It goes through the command line (`sx2torch FILE`, `explain`,
`run`), `compile_string`, `compile_file`, `load`, `explain` and `interpret.load`. Each must
end in success, a `SourceError` (exit 1 and a located diagnostic) or a `UsageError` (exit 2):
an internal error, a traceback, an exception of another type or a hang is a finding, saved
to the found folder. The counts by entry point and outcome are printed at the end.

A quarter of the inputs are golden cases and difftest-corpus programs edited as tools/fuzz
edits them. The made ones' sizes are small (at most 4) or past the compiler's limits; an
edited one whose parameters would take more than MAX_DRAWN bytes is not given to the
interpreter's entry points, which draw them (counted as skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import random
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

import torch

import sx2torch
from sx2torch import cli, interpret
from sx2torch.errors import SourceError, UsageError
from tools import fuzz
from tools.fuzz import DIAGNOSTIC, Hang

NUMBERS = [
    "0", "-0", "-0.0", "1", "2", "4", "-1", "-4", "0.5", "1e999", "-1e999", "1e-999", "nan",
    "inf", "-inf", "NaN", "+inf", "9" * 40, "-9223372036854775809", "9223372036854775807",
    "1e308", "5e-324", "0x10", "1_000", "1/2", "+1", ".5", "5.", "1e", "1.0e+", "-.0",
    "68719476737", "(** 2 63)", "(** -8 0.5)", "(/ 1 0)", "(// 1 0)", "(- 0 (** 2 63))",
    "(sqrt -1.0)", "(log 0.0)", "(log -1.0)", "(exp 1000.0)", "(** 0.0 -1)", "(mod 1 0)",
]  # fmt: skip
NAMES = [
    "x", "w", "v", "d", "helper", "self", "torch", "F", "nn", "sx", "print", "len", "list",
    "None", "True", "class", "lambda", "def", "return", "super", "__init__", "__class__",
    "forward", "state_dict", "parameters", "training", "eval", "exec", "import", "int",
    "float", "tensor", "dtype", "device", "λ", "ñ", "x\u200b", "é", "🙂", "Ⅸ", "x.y",
    "a.b.c", "-", "+", "*", "?", "!", "->", "&rest", "&key", "&optional", "nil", "t", "_",
    "__", "x-y", "x_y", "1x", "w.w", "register_buffer", "cuda", "to", "half",
]  # fmt: skip
KEYWORDS = [
    ":f32", ":bf16", ":f64", ":f16", ":high", ":axes", ":axis", ":keepdims", ":out", ":eps",
    ":bogus", ":", ":precision", ":s", ":std", ":dtype", ":trainable", ":numerics", ":λ",
]  # fmt: skip
SHAPES = [
    "[4 4]", "[4]", "[]", "[0]", "[0 4]", "[-1]", "[4 -4]", "[1e3]", "[1.5]", "[d d]",
    "[(- d 5)]", "[nan]", "[4 4 4 4 4 4 4 4 4]", "[100000 100000 100000]", "[(** 2 40)]",
    "(4 4)", "4", "[:a]", "[x]", "[\"4\"]",
]  # fmt: skip
OPS = [
    "+", "-", "*", "/", "//", "**", "matmul", "linear", "sum", "mean", "amax", "softmax",
    "exp", "log", "sqrt", "neg", "abs", "tanh", "sigmoid", "relu", "gelu", "silu", "minimum",
    "maximum", "where", "reshape", "transpose", "swap-axes", "concat", "slice", "at", "take",
    "one-hot", "cast", "cast-run", "rms-norm", "fused-rms-norm", "layer-norm", "attention",
    "causal-attention", "softcap", "dropout", "linspace", "arange", "positions", "size",
    "scalar-like", "cross-entropy", "topk", "argmax", "let", "if", "when", "for", "chain",
    "gradient", "with-numerics", "defun", "defparam", "matmull", "quote", "lambda",
]  # fmt: skip
BASE = """\
(defconst d 4)
(defparam w (normal [4 4]))
(defparam v (normal [4]))
(defmodel blk (&key (n 4))
  (defparam g (ones [n]))
  (defun forward (x) (* x g)))
(defparam blocks (stack 2 (blk :n 4)))
(defun helper (x &key (s 1.0)) (* x s))
(defun forward (x)
  {body})
{extra}(defrun train :precision {precision})
"""
# The golden cases and the difftest corpus: small models, whose parameters the interpreter
# draws in little memory (the examples' defaults make large ones).
SMALL = sorted(
    p.read_bytes()
    for folder in (fuzz.ROOT / "golden", fuzz.ROOT / "tests/interpret/difftest_corpus")
    for p in folder.glob("*.lisp")
)
POOL = sorted({t for data in SMALL for t in fuzz.tokens(data) if len(t) < 40})
BODIES = [
    "(matmul (helper x) w)",
    "(+ (helper x :s 2.0) v)",
    "(for (i layer blocks) ((h x)) (layer h))",
    "(let ((y (matmul x w))) (sum y :axes [-1]))",
]


def _expr(rng: random.Random, depth: int) -> str:
    """A hostile expression, mostly well bracketed."""
    pick = rng.randrange(12 if depth < 4 else 4)
    if pick == 0:
        return rng.choice(NUMBERS)
    if pick == 1:
        return rng.choice(NAMES)
    if pick == 2:
        return rng.choice(["x", "w", "v", "(helper x)"])
    if pick == 3:
        return rng.choice(KEYWORDS + ['"text"', "[1 2]", "[]", "()", "[x w]"])
    if pick == 4:  # deep nesting
        n = rng.choice([50, 200, 1000, 3000, 20000])
        op = rng.choice(["neg", "+", "helper", "let ()", "("])
        if op == "(":
            return "(" * n + "x" + ")" * n
        close = " 1.0)" if op == "+" else ")"
        return f"({op} " * n + "x" + close * n
    if pick == 5:
        index = rng.choice(["0", "3", "4", "100", "-5", "d", "1.5", "nan", "x"])
        return f"(at {rng.choice(['w', 'v', '(sum x)', 'x'])} {index})"
    if pick == 6:
        perm = rng.choice(["[1 0]", "[0 0]", "[0 1 2]", "[2 0]", "[]", "[d 0]"])
        return f"(transpose {rng.choice(['w', 'v', 'x'])} {perm})"
    if pick == 7:
        steps = rng.choice(["-3", "0", "3", "1e999", "nan", "(** 2 62)"])
        return rng.choice(
            [f"(linspace x 0.0 1.0 {steps})", f"(arange x 0 {steps} {steps})"]
        )
    if pick == 8:
        return rng.choice(
            [
                f"(cast x {rng.choice(KEYWORDS)})",
                f"(attention {_expr(rng, depth + 1)} v x)",
                f"(helper x :s {rng.choice(NUMBERS)} :s 1.0)",
                f"(helper x {rng.choice(KEYWORDS)} 1.0)",
                "(helper x x x)",
                "(helper)",
                "(helper x :s)",
                f"(let (({rng.choice(NAMES)} x)))",
                f"(let (({rng.choice(NAMES)} x) ({rng.choice(NAMES)} w)) {rng.choice(NAMES)})",
                f"(gradient (sum {_expr(rng, depth + 1)}) x)",
                f"(gradient {_expr(rng, depth + 1)} w)",
                f"(sum x :axes [{rng.choice(NUMBERS)}])",
                f"(reshape x [{rng.choice(NUMBERS)} -1 -1])",
                f"(if {rng.choice(['true', '(< d 3)', 'x', 'nan'])} x w)",
                f"(with-numerics {rng.choice(KEYWORDS)} {_expr(rng, depth + 1)})",
            ]
        )
    # an op of the library or a form, with arguments and keys of any kind and number
    args = [_expr(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 2, 3, 5]))]
    if rng.random() < 0.3:
        args += [rng.choice(KEYWORDS), _expr(rng, depth + 1)]
    return f"({rng.choice(OPS)}{''.join(' ' + a for a in args)})"


def _extra(rng: random.Random) -> str:
    """Top-level forms beside the model: recursion, call chains, odd definitions."""
    pick = rng.randrange(10)
    if pick == 0:
        return "(defun f (x) (f x))\n"
    if pick == 1:
        return "(defun f (x) (g x))\n(defun g (x) (f x))\n"
    if pick == 2:  # a call chain around the limit of 64
        n = rng.choice([60, 63, 64, 65, 70, 200])
        return "".join(f"(defun c{i} (x) (c{i + 1} x))\n" for i in range(n)) + (
            f"(defun c{n} (x) (forward x))\n"
            if rng.random() < 0.2
            else f"(defun c{n} (x) x)\n"
        )
    if pick == 3:
        return rng.choice(
            [
                "(defun g (x &rest r) x)\n",
                "(defun g (x &optional y) x)\n",
                "(defun g (x &key (k 1) (k 2)) x)\n",
                "(defun g (x x) x)\n",
                "(defun g () 1.0)\n",
                "(defun g (x))\n",
                "(defun g (x &key k) x)\n",
                f"(defun {rng.choice(NAMES)} (x) x)\n",
            ]
        )
    if pick == 4:
        init = rng.choice(["normal", "zeros", "ones", "uniform", "eye", "linspace"])
        shape = (
            rng.choice(SHAPES)
            if init not in ("eye", "linspace")
            else rng.choice(["0", "-3", "4", "(** 2 40)", "nan", "1.5"])
        )
        return f"(defparam {rng.choice(NAMES)} ({init} {shape}))\n"
    if pick == 5:
        count = rng.choice(["0", "-1", "2", "70000", "1.5", "nan", "(** 2 62)"])
        return rng.choice(
            [
                f"(defparam p (repeat {count} (normal [4])))\n",
                f"(defparam p (stack {count} (blk :n 4)))\n",
                f"(defparam p (blk :n {rng.choice(NUMBERS)}))\n",
                "(defparam p (blk :m 4))\n",
                "(defparam p (stack 2 (zeros [4])))\n",
            ]
        )
    if pick == 6:
        return f"(defconst {rng.choice(NAMES)} {rng.choice(NUMBERS)})\n"
    if pick == 7:
        return rng.choice(
            ["(defmodel m (&key (n 1)) (defparam q (m)) (defun forward (x) x))\n",
             "(defmodel forward () (defun forward (x) x))\n",
             "(defrun train :precision :bf16)\n", "(defrun r :loss nope)\n",
             "(require numpy)\n", "(defflag f)\n", "(tie w v)\n"]
        )  # fmt: skip
    return ""


def make(rng: random.Random) -> str:
    """One hostile source."""
    if rng.random() < 0.25:  # a bundled small program, edited as tools/fuzz edits
        return fuzz.mutate(rng.choice(SMALL), rng, POOL).decode("utf-8", "replace")
    if rng.random() < 0.05:  # bracket and token soup
        return "".join(
            rng.choice(["(", ")", "[", "]", " ", "x", "1", ":k", '"', ";", "\n", "λ"])
            for _ in range(rng.randint(0, 60))
        )
    body = rng.choice(BODIES) if rng.random() < 0.35 else _expr(rng, 0)
    extra = "".join(_extra(rng) for _ in range(rng.randint(0, 2)))
    precision = rng.choice([":bf16", ":f32", ":bf16", ":f16", "bf16"])
    return BASE.format(body=body, extra=extra, precision=precision)


# Outcomes: what an entry point may end in, and what is a finding.
OK, SOURCE, USAGE = "ok", "source-error", "usage-error"
INTERNAL, HANG = "internal", "hang"
SKIPPED = "skipped"  # the interpreter's entry points, on a model too large to draw


def _cli(argv: list) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    text = err.getvalue()
    if "Traceback" in text or "internal compiler error" in text or rc not in (0, 1, 2):
        raise AssertionError(f"exit {rc}: {text.strip()[-300:]}")
    if rc == 1 and not DIAGNOSTIC.match(text):
        raise AssertionError(f"exit 1 without a located diagnostic: {text[:200]!r}")
    return {0: OK, 1: SOURCE, 2: USAGE}[rc]


def entry_points(path: Path, inputs: Path) -> dict:
    """{name: a call of that entry point on the source at `path`, giving an outcome}."""
    name = str(path)

    def interpret_load():
        interpret.load(path.read_text("utf-8"), path.name)
        return OK

    def api(call) -> Callable:
        return lambda: (call(), OK)[1]

    return {
        "cli": lambda: _cli([name]),
        "cli-explain": lambda: _cli(["explain", name, "--json"]),
        "cli-run": lambda: _cli(["run", name, "--input", f"x={inputs}"]),
        "compile_string": api(
            lambda: sx2torch.compile_string(path.read_text("utf-8"), path.name)
        ),
        "compile_file": api(lambda: sx2torch.compile_file(path)),
        "load": api(lambda: sx2torch.load(path)),
        "explain": api(lambda: sx2torch.explain(path)),
        "interpret.load": interpret_load,
    }


def outcome(call: Callable, limit_s: float) -> tuple:
    """(outcome, what went wrong or None) of one call."""

    def alarm(signum, frame):
        raise Hang()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a SourceWarning is a success
            return call(), None
    except Hang:
        return HANG, f"no answer within {limit_s} s"
    except SourceError as error:
        if error.filename is None or error.line < 1:
            return INTERNAL, f"unlocated: {error}"
        return SOURCE, (error.line, error.column, error.message)
    except UsageError:
        return USAGE, None
    except AssertionError as error:  # _cli's finding
        return INTERNAL, str(error)
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        return INTERNAL, f"{type(error).__name__}: {str(error)[:300]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check(text: str, work: Path, limit_s: float = 10.0) -> dict:
    """{entry point: (outcome, finding or None)} for one source; the interpreter must
    accept what the compiler accepts and reject the rest with the same diagnostic."""
    path = work / "model.lisp"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    inputs = work / "x.pt"
    if not inputs.exists():
        torch.save(torch.randn(2, 4), inputs)
    calls = entry_points(path, inputs)
    ended = {entry: outcome(calls.pop(entry), limit_s) for entry in FIRST}
    if ended["explain"][0] == OK and _drawn_bytes(path) > MAX_DRAWN:
        ended.update({entry: (SKIPPED, None) for entry in calls})
    else:
        ended.update({entry: outcome(call, limit_s) for entry, call in calls.items()})
    compiled, interpreted = ended["compile_string"], ended["interpret.load"]
    kinds = {compiled[0], interpreted[0]}
    if compiled != interpreted and not kinds & {INTERNAL, SKIPPED}:
        ended["interpret.load"] = (
            INTERNAL,
            f"the compiler ends in {compiled}, the interpreter in {interpreted}",
        )
    return {
        entry: (kind, None if kind == SOURCE else said)
        for entry, (kind, said) in ended.items()
    }


# The entry points that draw no parameters, run first: explain's sizes say whether the
# interpreter's would fit in MAX_DRAWN bytes (an edited size may make a large legal one).
FIRST = ("cli", "cli-explain", "compile_string", "compile_file", "load", "explain")
MAX_DRAWN = 256 << 20


def _drawn_bytes(path: Path) -> int:
    return sx2torch.explain(path)["totals"]["all"]


def campaign(n: int, seed: int, found_dir: Path, limit_s: float) -> int:
    rng = random.Random(seed)
    counts: Counter = Counter()
    findings = 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as work:
        for tried in range(1, n + 1):
            text = make(rng)
            for entry, (kind, finding) in check(text, Path(work), limit_s).items():
                counts[entry, kind] += 1
                if finding:
                    findings += 1
                    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass"))
                    stem = found_dir / f"{entry}-{digest.hexdigest()[:12]}"
                    found_dir.mkdir(parents=True, exist_ok=True)
                    stem.with_suffix(".lisp").write_text(text, "utf-8", "surrogatepass")
                    stem.with_suffix(".txt").write_text(finding + "\n", "utf-8")
                    print(f"[{tried}] {entry}: {finding[:200]}", flush=True)
            if tried % 500 == 0 or tried == n:
                rate = tried / (time.monotonic() - started)
                print(f"{tried} inputs ({rate:.1f}/s), {findings} findings", flush=True)
    print(f"done: {n} inputs (seed {seed}), {findings} findings")
    print(table(counts))
    return 1 if findings else 0


def table(counts: Counter) -> str:
    kinds = (OK, SOURCE, USAGE, INTERNAL, HANG, SKIPPED)
    entries = sorted({entry for entry, _ in counts})
    lines = ["| entry point | " + " | ".join(kinds) + " |"]
    lines.append("| --- |" + " --- |" * len(kinds))
    for entry in entries:
        cells = " | ".join(str(counts[entry, kind]) for kind in kinds)
        lines.append(f"| {entry} | {cells} |")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.hostile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--n", type=int, default=1000, help="inputs (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--found", type=Path, default=Path("hostile-found"), help="folder for findings"
    )
    parser.add_argument(
        "--limit", type=float, default=10.0, help="seconds per entry point (default 10)"
    )
    args = parser.parse_args(argv)
    return campaign(args.n, args.seed, args.found, args.limit)


if __name__ == "__main__":
    sys.exit(main())
