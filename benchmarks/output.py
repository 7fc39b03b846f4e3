"""output: the generated file's size against its source's, and a one-line edit's hunks.

For every example and golden case on every target it prints the generated module's code
lines against the source's (code lines: no blank line, no comment, no docstring; the
training script's `__main__` block left out, it is configuration, not the model). For
tiny-gpt it adds the hand-written reference in benchmarks/gpt.py (its norm and its two
classes, with their seed switches), and
for a GPT-2 as a newcomer writes it (pre-LayerNorm blocks calling `ln`, `attn` and
`mlp`) its source's. Last, the hunks of `git diff`-style unified diffs that one added
`let` binding inside a sub-model gives. Goals (issue 22): tiny-gpt <= 1.25x the
reference, the GPT-2 <= 2x its source, one hunk for the one-line edit.

Run: ``python -m benchmarks.output [--target cuda]``.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import tokenize
from pathlib import Path

from sx2torch.compiler import TARGETS, Options, compile_source

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    (p for d in ("examples", "golden") for p in (ROOT / d).glob("*.lisp")),
    key=lambda p: (p.parent.name, p.name),
)

# A newcomer's GPT-2: pre-LayerNorm blocks, each calling `ln`, `attn` and `mlp`.
GPT2 = """\
(require sexpgpu/nn)

(defconst vocab 256)
(defconst d 64)
(defconst n-head 4)
(defconst n-layer 2)

(defmodel ln (&key (d 64))
  (defparam g (ones [d]))
  (defparam b (zeros [d]))
  (defun forward (x)
    (+ (* (layer-norm x) g) b)))

(defmodel block (&key (d 64) (n-head 4))
  (defparam ln1 (ln :d d))
  (defparam ln2 (ln :d d))
  (defparam w-qkv (normal [d (* 3 d)] :std 0.02))
  (defparam w-proj (normal [d d] :std 0.02))
  (defparam w-fc (normal [d (* 4 d)] :std 0.02))
  (defparam w-out (normal [(* 4 d) d] :std 0.02))

  (defun heads (x)
    (transpose (reshape x [0 0 n-head (// d n-head)]) [0 2 1 3]))

  (defun attn (x)
    (let ((qkv (matmul x w-qkv))
          (q (heads (slice qkv :axis -1 :start 0 :end d)))
          (k (heads (slice qkv :axis -1 :start d :end (* 2 d))))
          (v (heads (slice qkv :axis -1 :start (* 2 d) :end (* 3 d))))
          (y (causal-attention q k v)))
      (matmul (reshape (transpose y [0 2 1 3]) [0 0 -1]) w-proj)))

  (defun mlp (x)
    (matmul (gelu (matmul x w-fc)) w-out))

  (defun forward (x)
    (let ((x (+ x (attn (ln1 x)))))
      (+ x (mlp (ln2 x))))))

(defparam wte (normal [vocab d] :std 0.02))
(defparam blocks (stack n-layer (block :d d :n-head n-head)))
(defparam ln-f (ln :d d))
(defparam lm-head (normal [d vocab] :std 0.02))

(defun forward (idx)
  (let ((x (take wte idx))
        (x (chain blocks x)))
    (matmul (ln-f x) lm-head)))

(defun loss (idx targets)
  (cross-entropy (reshape (forward idx) [-1 vocab]) (reshape targets [-1])))

(defrun train :precision :bf16 :loss loss :batch-size 8 :seq-len 32)
"""
# The one-line edit: a `let` binding added inside the block's attention.
GPT2_EDIT = (
    "          (y (causal-attention q k v)))\n",
    "          (y (causal-attention q k v))\n          (y (* y 2.0)))\n",
)
REFERENCE = ("norm", "ReferenceBlock", "ReferenceGpt")


def lisp_lines(text: str) -> int:
    """Source lines that hold code: no blank line, no comment, no docstring."""
    count = 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith(";") and not _lisp_doc(stripped):
            count += 1
    return count


def _lisp_doc(line: str) -> bool:
    return line.startswith('"') and line.endswith('"') and line.count('"') == 2


def python_lines(code: str) -> int:
    """Code lines of a Python module: no blank line, comment or docstring, and no
    `if __name__ == "__main__":` block."""
    tree = ast.parse(code)
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            skip.update(range(body[0].lineno, body[0].end_lineno + 1))
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            skip.update(range(node.lineno, node.end_lineno + 1))
    return len(_code_line_numbers(code) - skip)


def _is_docstring(node) -> bool:
    return isinstance(node, ast.Expr) and isinstance(
        getattr(node, "value", None), ast.Constant
    )


def _code_line_numbers(code: str) -> set:
    lines = set()
    ignored = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT)
    ignored += (tokenize.DEDENT, tokenize.ENDMARKER, tokenize.ENCODING)
    for token in tokenize.tokenize(io.BytesIO(code.encode()).readline):
        if token.type not in ignored:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def reference_lines() -> int:
    """Code lines of benchmarks/gpt.py's norm, ReferenceBlock and ReferenceGpt."""
    code = (ROOT / "benchmarks" / "gpt.py").read_text()
    tree = ast.parse(code)
    kept = [n for n in tree.body if getattr(n, "name", None) in REFERENCE]
    lines = code.splitlines()
    text = "\n".join("\n".join(lines[n.lineno - 1 : n.end_lineno]) for n in kept)
    return python_lines(text)


def hunks(before: str, after: str) -> int:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), n=3)
    return sum(1 for line in diff if line.startswith("@@"))


def compiled(text: str, name: str, target: str) -> str:
    return compile_source(text, name, Options(target=target))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=TARGETS, action="append")
    targets = parser.parse_args().target or list(TARGETS)
    print(f"{'case':40} {'source':>6} " + " ".join(f"{t:>12}" for t in targets))
    totals = dict.fromkeys(targets, 0)
    source_total = 0
    for path in SOURCES:
        text = path.read_text()
        source = lisp_lines(text)
        source_total += source
        cells = []
        for target in targets:
            lines = python_lines(compiled(text, path.name, target))
            totals[target] += lines
            cells.append(f"{lines:5} {lines / source:5.2f}x")
        name = f"{path.parent.name}/{path.name}"
        print(f"{name:40} {source:6} " + " ".join(f"{c:>12}" for c in cells))
    cells = [f"{totals[t]:5} {totals[t] / source_total:5.2f}x" for t in targets]
    print(f"{'total':40} {source_total:6} " + " ".join(f"{c:>12}" for c in cells))
    reference = reference_lines()
    tiny = (ROOT / "examples" / "tiny-gpt.lisp").read_text()
    gpt2 = lisp_lines(GPT2)
    print(f"\nbenchmarks/gpt.py reference (modded-nanogpt style): {reference} lines")
    for target in targets:
        lines = python_lines(compiled(tiny, "tiny-gpt.lisp", target))
        print(f"tiny-gpt {target}: {lines} / {reference} = {lines / reference:.2f}x")
    for target in targets:
        before = compiled(GPT2, "gpt2.lisp", target)
        after = compiled(GPT2.replace(*GPT2_EDIT), "gpt2.lisp", target)
        lines = python_lines(before)
        print(
            f"newcomer's gpt-2 {target}: {lines} / {gpt2} = {lines / gpt2:.2f}x; "
            f"one-line edit in block: {hunks(before, after)} hunk(s)"
        )


if __name__ == "__main__":
    main()
