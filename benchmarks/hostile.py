"""Compile time and memory against source size, on the shapes a hostile-input campaign found
superlinear: a wide n-ary sum, a long `let`, many consts, a huge docstring.

Each shape is compiled at a size and at four times it, each in a fresh process (its peak RSS is
the process's); the table gives seconds and MB per MB of source and the 4x/1x ratios (4.0 is
linear). Run: ``python -m benchmarks.hostile [--scale 1.0]``.
"""

import argparse
import resource
import subprocess
import sys
import time

SHAPES = {
    "wide sum": (
        2500,
        lambda n: "(defparam w (normal [4 4]))\n(defun forward (x) (matmul (+ "
        + " ".join(["x"] * n)
        + ") w))\n",
    ),
    "long let": (
        2500,
        lambda n: "(defun forward (x)\n  (let ("
        + "\n        ".join(
            f"(v{i} (+ {'x' if i == 0 else f'v{i - 1}'} 1.0))" for i in range(n)
        )
        + f")\n    v{n - 1}))\n",
    ),
    "many consts": (
        2500,
        lambda n: "".join(f"(defconst c{i} {i})\n" for i in range(n))
        + f"(defun forward (x) (* x c{n - 1}))\n",
    ),
    "docstring": (
        1 << 20,
        lambda n: '(defun forward (x)\n  "' + "a" * n + '"\n  (relu x))\n',
    ),
}
CHILD = """\
import resource, sys, time
from sx2torch.compiler import compile_source
text = sys.stdin.read()
started = time.perf_counter()
try:
    compile_source(text, "hostile.lisp")
    outcome = "ok"
except Exception as error:
    outcome = type(error).__name__
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, outcome)
"""


def measure(text: str) -> tuple:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, kib, outcome = done.stdout.split()
    return float(seconds), int(kib) / 1024, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="times the base sizes")
    args = parser.parse_args()
    baseline = measure("(defun forward (x) (relu x))\n")[1]
    print(f"an empty compile's peak RSS: {baseline:.0f} MB (subtracted below)")
    print(
        f"{'shape':<12} {'n':>7} {'source':>9} {'s':>7} {'MB':>6}   {'at 4x n':>9} {'s':>7} {'MB':>6}   s/MB   MB/MB   ratio s, MB"
    )
    for name, (base, make) in SHAPES.items():
        n = int(base * args.scale)
        rows = []
        for size in (n, 4 * n):
            text = make(size)
            seconds, peak, outcome = measure(text)
            rows.append(
                (len(text.encode()) / 1e6, seconds, max(peak - baseline, 0.0), outcome)
            )
        (b1, s1, m1, o1), (b4, s4, m4, o4) = rows
        print(
            f"{name:<12} {n:>7} {b1:>7.2f}MB {s1:>7.2f} {m1:>6.0f}   {b4:>7.2f}MB {s4:>7.2f} {m4:>6.0f}"
            f"   {s4 / b4:>4.1f} {m4 / b4:>7.0f}   {s4 / s1:>4.1f}, {m4 / max(m1, 1):.1f}"
            + ("" if o1 == o4 == "ok" else f"   ({o1}, {o4})")
        )


if __name__ == "__main__":
    main()
