"""transpile: compile time and peak memory against source size, against black, and start-up.

Four synthetic source shapes grow from a base size to 4x and 16x: many defuns in one
model (each calling the previous, in chains of 32, since calls nest at most 64 deep;
every third reading a parameter), many sub-models
(a defmodel and a defparam instance each, all applied in the top forward),
tiny-gpt-like attention blocks (one defmodel each), and many parameters of one model,
each read once by its forward. For each size it prints the
in-process compile time (`compile_source`, median of the reps) per 1,000 source lines,
the whole-process time of the CLI's `sx2torch FILE -o OUT` and its peak RSS, each
measured in a fresh subprocess; then the exponent of the in-process time against the
source's lines from 1x to 16x (1.0: linear; goal <= 1.05), and the peak RSS added per
1,000 lines from 1x to 4x and from 4x to 16x (equal: linear).

P1 compares, at the largest attention source (~4,000 lines at 16x), the whole-process
compile with black formatting the same output in-process as one module
(`black.format_str`, default mode), interleaved, medians of the reps each; goal <= 1.0.
Then the same with each block's parameters named apart (its classes share fewer lines,
which the format pass formats once each). Every compile runs without the format pass's
cache (SX2TORCH_NO_CACHE), but for the cache's figure: the compile again with the cache
filled, as `sx2torch check` on an unchanged model or a second compile of it runs.

Start-up compares the whole-process compile of a typical source (`examples/bert.lisp`,
104 lines) with `python -m black --fast` on its output, each in a fresh process and each
with its cache cold (the compile without the format cache, black with `--no-cache`: from
its cache, black reads the file, finds its hash and formats nothing); goal <= 1.5. Both
again with their caches filled, as `sx2torch check` on an unchanged model runs, and where
the cold compile's time goes, each part measured in a fresh process of its own: Python,
importing libcst, importing the package's own modules (the command line's import less
libcst's), importing black (which a compile does only to format a long line the format
pass does not split itself: none of bert's), and the rest (the passes, the format pass,
writing the file).

Every time is CPU time (user and system, a subprocess's from its rusage), so that other
work on a loaded machine weighs less on the figures.

Run: ``python -m benchmarks.transpile [--scale 1] [--reps 3] [--shape NAME]
[--start-up]`` (`--start-up`: that part alone).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import black

from sx2torch.compiler import compile_source

SCALES = (1, 4, 16)
CHAIN = 32  # defuns per call chain in `defuns`


def defuns(n: int) -> str:
    lines = ["(defconst d 8)", "(defparam w (normal [d d] :std 0.02))", ""]
    for i in range(n):
        if i % CHAIN == 0:  # calls nest at most 64 deep: start a new chain
            lines.append(f"(defun f{i} (x)\n  (matmul x w))")
            continue
        body = f"(matmul (f{i - 1} x) w)" if i % 3 == 0 else f"(* 0.5 (f{i - 1} x))"
        lines.append(f'(defun f{i} (x)\n  "Step {i}."\n  (+ x {body}))')
    ends = [i - 1 for i in range(CHAIN, n, CHAIN)] + [n - 1]
    steps = "\n        ".join(f"(y (+ y (f{i} x)))" for i in ends)
    lines.append(f"(defun forward (x)\n  (let ((y x)\n        {steps})\n    y))")
    lines.append("(defrun train :precision :f32)")
    return "\n".join(lines) + "\n"


def submodels(n: int) -> str:
    lines = ["(defconst d 8)", ""]
    for i in range(n):
        lines.append(
            f"(defmodel layer-{i} (&key (d 8))\n"
            f"  (defparam w (normal [d d] :std 0.02))\n"
            f"  (defparam b (zeros [d]))\n"
            f"  (defun forward (x)\n"
            f"    (+ x (gelu (+ (matmul x w) b)))))"
        )
    lines += [f"(defparam p{i} (layer-{i} :d d))" for i in range(n)]
    steps = "\n        ".join(f"(x (p{i} x))" for i in range(n))
    lines.append(f"(defun forward (x)\n  (let ({steps})\n    x))")
    lines.append("(defrun train :precision :f32)")
    return "\n".join(lines) + "\n"


def params(n: int) -> str:
    """Many parameters in one model, each read once by the forward (500 to 3,000 of them
    took time growing faster than their number)."""
    lines = ["(defconst d 8)", ""]
    lines += [f"(defparam w{i} (normal [d] :std 0.02))" for i in range(n)]
    steps = "\n        ".join(f"(y (+ y w{i}))" for i in range(n))
    lines.append(f"(defun forward (x)\n  (let ((y x)\n        {steps})\n    y))")
    lines.append("(defrun train :precision :bf16)")
    return "\n".join(lines) + "\n"


# The block of the bundled GPT, one copy per sub-model of the attention shape.
TINY_GPT = (
    Path(__file__).resolve().parent.parent / "examples" / "tiny-gpt.lisp"
).read_text()
BLOCK = TINY_GPT[TINY_GPT.index("(defmodel block ") : TINY_GPT.index("(defparam wte")]


def attention(n: int, distinct: bool = False) -> str:
    """`distinct`: each block's parameters and its `qkv` named apart, so that no two
    classes share a statement that reads them (the format pass formats each distinct
    long line once)."""
    lines = ["(require sexpgpu/nn)", "(defconst d 64)", "(defconst n-head 4)", ""]
    for i in range(n):
        block = BLOCK.replace("(defmodel block ", f"(defmodel block-{i} ", 1)
        if distinct:
            block = re.sub(r"\b(w-qkv|w-o|w-up|w-down|qkv)\b", rf"\1-{i}", block)
        lines.append(block)
    lines += [f"(defparam b{i} (block-{i} :d d :n-head n-head))" for i in range(n)]
    steps = "\n        ".join(f"(x (b{i} x))" for i in range(n))
    lines.append(f"(defun forward (x)\n  (let ({steps})\n    (rms-norm x)))")
    lines.append("(defrun train :precision :bf16)")
    return "\n".join(lines) + "\n"


SHAPES = {
    "defuns": (defuns, 250),
    "submodels": (submodels, 60),
    "attention": (attention, 10),
    "params": (params, 250),
}


def median(step, reps: int) -> tuple:
    """The median CPU time of `reps` runs of `step()`, and its last result."""
    times = []
    for _ in range(reps):
        start = time.process_time()
        result = step()
        times.append(time.process_time() - start)
    return statistics.median(times), result


def child_cpu(command: list, env: dict | None = None, **run) -> tuple:
    """CPU seconds of a subprocess (user and system) and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.run(command, env=env, **run)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = sum(
        getattr(after, f) - getattr(before, f) for f in ("ru_utime", "ru_stime")
    )
    return seconds, child


# `python -m sx2torch FILE -o OUT`, then its peak RSS: VmHWM is the process's own high-water
# mark, where getrusage's ru_maxrss would count the parent's memory copied by the fork.
CHILD = """import sys
from sx2torch.cli import main
code = main(sys.argv[1:])
peak = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(int(peak.split()[1]), file=sys.stderr)
sys.exit(code)
"""


def bytecode_env() -> dict:
    """The environment, with Python writing bytecode: with PYTHONDONTWRITEBYTECODE set (as
    on this project's CI machine) every process compiled sx2torch's sources again, a fifth
    of a small compile's start-up that no installed package pays: pip writes the bytecode,
    and so does a checkout's first run."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def whole_process(path: Path, out: Path, cache: Path | None = None) -> tuple:
    """Seconds and peak RSS (MiB) of a compile of `path` in a fresh process, with the
    format cache in `cache` or without one."""
    env = bytecode_env()
    if cache is not None:
        env.pop("SX2TORCH_NO_CACHE", None)
        env["SX2TORCH_CACHE_DIR"] = str(cache)
    seconds, child = child_cpu(
        [sys.executable, "-c", CHILD, str(path), "-o", str(out)],
        env,
        stderr=subprocess.PIPE,
        text=True,
    )
    if child.returncode != 0:
        sys.exit(f"compiling {path} failed:\n{child.stderr}")
    return seconds, int(child.stderr.split()[-1]) / 1024  # VmHWM is in KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply base sizes")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--shape", choices=SHAPES, action="append")
    parser.add_argument(
        "--start-up", action="store_true", help="measure the start-up alone"
    )
    args = parser.parse_args()
    os.environ["SX2TORCH_NO_CACHE"] = (
        "1"  # every compile formats; the cache has its figure
    )
    work = Path(tempfile.mkdtemp(prefix="transpile-"))
    if args.start_up:
        start_up(args.reps, work)
        return
    print(
        f"{'shape':>10} {'size':>5} {'lines':>6} | {'ms/kline in-proc':>16} "
        f"{'whole':>7} | {'peak MiB':>8} {'MiB/kline':>9}"
    )
    p1 = None
    for shape in args.shape or SHAPES:
        make, base = SHAPES[shape]
        rows = []
        for scale in SCALES:
            size = max(1, round(base * args.scale * scale))
            text = make(size)
            lines = text.count("\n")
            path = work / f"{shape}-{size}.lisp"
            path.write_text(text)
            seconds, code = median(lambda: compile_source(text, path.name), args.reps)
            whole, peak = whole_process(path, work / f"{shape}-{size}.py")
            per = 1000 / lines
            rows.append((seconds, whole * per, peak, lines))
            print(
                f"{shape:>10} {size:>5} {lines:>6} | {seconds * per * 1000:>16.0f} "
                f"{whole * per * 1000:>7.0f} | {peak:>8.0f} {peak * per:>9.1f}"
            )
            if shape == "attention" and scale == SCALES[-1]:
                p1 = (lines, code, path)
        (
            (in1, whole1, peak1, lines1),
            (_, _, peak4, lines4),
            (in16, whole16, peak16, lines16),
        ) = rows
        grow_low = (peak4 - peak1) / (lines4 - lines1) * 1000
        grow_high = (peak16 - peak4) / (lines16 - lines4) * 1000
        exponent = math.log(in16 / in1) / math.log(lines16 / lines1)
        print(
            f"{shape:>10} in-process time ~ lines^{exponent:.2f} from 1x to 16x "
            f"(goal <= 1.05); whole-process 16x/1x per kline {whole16 / whole1:.2f}; "
            f"peak RSS MiB per added kline: 1x-4x {grow_low:.1f}, 4x-16x {grow_high:.1f}"
        )
    if p1 is not None:
        lines, code, path = p1
        ratio(f"P1 ({lines} source lines", path, code, args.reps, work)
        path = work / "attention-distinct.lisp"
        text = attention(round(160 * args.scale), distinct=True)
        path.write_text(text)
        code = compile_source(text, path.name)
        label = f"P1, blocks named apart ({text.count(chr(10))} source lines"
        ratio(label, path, code, args.reps, work)
        cache = work / "format-cache"
        whole_process(path, work / "p1.py", cache)  # fills the cache
        warm = [whole_process(path, work / "p1.py", cache)[0] for _ in range(args.reps)]
        print(
            "P1, blocks named apart, again with the format cache filled: "
            f"{statistics.median(warm):.2f} s"
        )
    start_up(args.reps, work)


def start_up(reps: int, work: Path) -> None:
    """A typical source's whole-process compile against `black --fast` on its output, cold
    and with their caches filled, and where the cold compile's time goes."""
    source = Path(__file__).resolve().parent.parent / "examples" / "bert.lisp"
    out, cache = work / "bert.py", work / "format-cache"
    black = [sys.executable, "-m", "black", "--fast", "-q", str(out), "--no-cache"]
    black_cached = [*black[:-1], "--cache-dir", str(work / "black")]
    python = [sys.executable, "-c"]
    steps = {
        "compile": lambda: whole_process(source, out)[0],
        "compile cached": lambda: whole_process(source, out, cache)[0],
        "black": lambda: child_cpu(black)[0],
        "black cached": lambda: child_cpu(black_cached)[0],
        "python": lambda: child_cpu([*python, "pass"])[0],
        "libcst": lambda: child_cpu([*python, "import libcst"])[0],
        "cli": lambda: child_cpu([*python, "import sx2torch.cli"], bytecode_env())[0],
        "cli, black": lambda: child_cpu(
            [*python, "import sx2torch.cli, black"], bytecode_env()
        )[0],
    }
    for step in ("compile", "compile cached", "black cached"):
        steps[step]()  # the bytecode written, the caches filled
    times: dict = {name: [] for name in steps}
    for _ in range(reps):  # interleaved
        for name, step in steps.items():
            times[name].append(step())
    t = {name: statistics.median(seconds) for name, seconds in times.items()}
    print(
        f"start-up ({source.name}, {source.read_text().count(chr(10))} lines, medians of "
        f"{reps}): whole-process compile {t['compile']:.2f} s, black --fast on its output "
        f"{t['black']:.2f} s, ratio {t['compile'] / t['black']:.2f} (goal <= 1.5); with "
        f"their caches filled {t['compile cached']:.2f} s and {t['black cached']:.2f} s"
    )
    own = t["cli"] - t["libcst"]
    black_import = t["cli, black"] - t["cli"]
    imports = imports_black(source, out)
    rest = t["compile"] - t["cli"] - (black_import if imports else 0.0)
    print(
        f"start-up, the compile's parts: Python {t['python']:.2f} s, importing libcst "
        f"{t['libcst'] - t['python']:.2f}, the package's modules {own:.2f}, black "
        + (f"{black_import:.2f}" if imports else f"not imported ({black_import:.2f})")
        + f"; the passes, the format pass and the write {rest:.2f}"
    )


def imports_black(source: Path, out: Path) -> bool:
    """Whether a cold compile of `source` imports black: only to format a long line the
    format pass does not split itself."""
    probe = (
        "import sys\n"
        "from sx2torch.cli import main\n"
        f"main([{str(source)!r}, '-o', {str(out)!r}])\n"
        "print('black' in sys.modules)\n"
    )
    env = {**os.environ, "SX2TORCH_NO_CACHE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True
    )
    return run.stdout.split() != ["False"]


def ratio(label: str, path: Path, code: str, reps: int, work: Path) -> None:
    """The whole-process compile of `path` against black on its output `code`."""
    wholes, blacks = [], []
    for _ in range(reps):  # interleaved, so that both see the same load
        wholes.append(whole_process(path, work / "p1.py")[0])
        blacks.append(median(lambda: black.format_str(code, mode=black.Mode()), 1)[0])
    whole, formatted = statistics.median(wholes), statistics.median(blacks)
    print(
        f"{label}, {code.count(chr(10))} output lines, medians of {reps}): "
        f"whole-process compile {whole:.2f} s, black in-process {formatted:.2f} s, "
        f"ratio {whole / formatted:.2f} (goal <= 1.0)"
    )


if __name__ == "__main__":
    main()
