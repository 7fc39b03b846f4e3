"""Warnings at compile time: printed located on stderr, --warn error and none, the output
unchanged; each warning kind; and explain's fix, compiled, changes only what it says."""

from __future__ import annotations

import difflib


from sx2torch import cli
from sx2torch.compiler import Options, compile_module, compile_source
from sx2torch.tools import explain
from cases import EXAMPLES

DENOISER = """\
(defconst d 8)
(defparam w1 (normal [d d]))
(defparam w2 (normal [d d]))
(defun forward (x t)
  (matmul (relu (+ (matmul x w1) t)) w2))
(defun loss (x t noise)
  (mean (square (- (forward x t) noise))))
(defrun train :precision :bf16)
"""
LOSS = "  (mean (square (- (forward x t) noise))))\n"
BOUND = """\
  (let ((pred (forward x t)))
    (with-numerics (:sensitivity :high) (mean (square (- pred noise))))))
"""
WRAPPED = (
    "  (with-numerics (:sensitivity :high) (mean (square (- (forward x t) noise)))))\n"
)


def messages(text: str, filename: str = "m.lisp", run=None) -> list:
    found = compile_module(text, filename, Options(run=run)).warnings
    return [(w.span.line, w.span.col, w.message) for w in found]


def run(capsys, *argv) -> tuple:
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_compiler_prints_warnings_located_and_keeps_the_output(capsys, tmp_path):
    path = tmp_path / "den.lisp"
    path.write_text(DENOISER)
    expected = compile_source(DENOISER, str(path), Options())
    rc, out, err = run(capsys, path)
    assert (rc, out) == (0, expected)
    assert err == (
        f"{path}:7:3: warning: (mean (square (- (forward x t) noise))) reduces in bf16, which "
        "loses the small terms of a long sum; bind (forward x t) with let first, then wrap the "
        "rest in (with-numerics (:sensitivity :high) ...)\n"
        "    (mean (square (- (forward x t) noise))))\n"
        "    ^\n"
        f"{path}:7:3: warning: loss returns a scalar computed in bf16, (mean (square (- (forward "
        "x t) noise))): a loss keeps only 8 bits of precision; bind (forward x t) with let "
        "first, then wrap the rest in (with-numerics (:sensitivity :high) ...)\n"
        "    (mean (square (- (forward x t) noise))))\n"
        "    ^\n"
    )
    assert run(capsys, path, "--warn", "none") == (0, expected, "")
    rc, out, err = run(capsys, path, "--warn", "error", "-o", tmp_path / "den.py")
    assert (rc, out) == (1, "") and not (tmp_path / "den.py").exists()
    assert err.count(": error: ") == 2 and ": warning: " not in err


def test_explains_fix_compiled_changes_only_the_loss():
    fixed = DENOISER.replace(LOSS, BOUND)
    assert messages(fixed) == []
    before = compile_source(DENOISER, "den.lisp").splitlines()
    after = compile_source(fixed, "den.lisp").splitlines()
    changed = [
        line
        for line in difflib.unified_diff(before, after, lineterm="", n=0)
        if line[:1] in "+-" and line[:3] not in ("+++", "---")
    ]
    assert changed == [
        "-        return torch.mean(torch.square(self.forward(x, t) - noise.to(torch.bfloat16)))",
        "+        pred = self.forward(x, t)",
        "+        # (with-numerics (:sensitivity :high) ...)",
        "+        return torch.mean(torch.square(pred.float() - noise))",
    ]


def test_an_island_around_a_call_is_warned_about():
    wrapped = DENOISER.replace(LOSS, WRAPPED)
    assert messages(wrapped) == [
        (
            7,
            56,
            "the island around (forward x t) reaches into the call: forward is compiled again, "
            "all in f32, for it; bind the call's result with let outside the island",
        )
    ]
    assert "def forward_f32" in compile_source(wrapped, "den.lisp")


def test_a_const_shadowed_where_it_seems_read_is_warned_about():
    """A const that a let local or a defun argument of its name shadows is not read there:
    the constructor takes it and nothing uses it (modded-nanogpt-simple's head-dim, once).
    """
    source = """\
(defconst head-dim 128)
(defconst width 8)
(defun heads (x head-dim) (* x head-dim))
(defun forward (x)
  (let ((width 2) (y (* x width)))
    (heads x y)))
"""
    assert messages(source) == [
        (1, 11, "'head-dim' is defined and never read; remove it"),
        (2, 11, "'width' is defined and never read; remove it"),
    ]


def test_unused_consts_and_keys_are_warned_about():
    source = """\
(defconst d 4)
(defconst n-layer 2)
(defmodel block (&key (d 4) (width 8))
  (defparam w (normal [d d]))
  (defun forward (x &key (scale 1.0)) (matmul x w)))
(defparam blocks (stack n-layer (block)))
(defun forward (x) (chain blocks x))
"""
    assert messages(source) == [
        (1, 11, "'d' is defined and never read; remove it"),
        (3, 30, "'width' is defined and never read; remove it"),
        (5, 27, "'scale' is defined and never read; remove it"),
    ]


def test_out_f32_on_f32_operands_is_warned_about():
    source = "(defparam w (normal [4 4]))\n(defun forward (x) (matmul x w :out :f32))\n"
    note = (
        ":out :f32 does nothing here: the matmul's operands are f32, so it is a plain f32 "
        "GEMM; remove it, or make an operand bf16"
    )
    assert messages(source) == [(2, 20, note)]
    assert messages(source + "(defrun train :precision :bf16)\n") == []


def test_explain_lists_the_same_warnings_with_columns():
    report = explain.run(DENOISER, "den.lisp")
    assert [
        (w["line"], w["column"], w["message"]) for w in report["warnings"]
    ] == messages(DENOISER, "den.lisp")


def test_an_unused_f32_specialization_is_not_explained_as_f32():
    source = """\
(defparam w (normal [4 4]))
(defun helper (h) (tanh h))
(defun forward (x) (helper (matmul x w)))
(defrun train :precision :bf16)
"""
    assert "def helper(" in compile_source(source, "m.lisp")
    assert [line["line"] for line in explain.run(source, "m.lisp")["lines"]] == []


def test_the_bundled_examples_warn_as_the_readme_says():
    found = {
        path.name: [
            (w.span.line, w.message.split(" ")[0])
            for w in compile_module(path.read_text(), path.name).warnings
        ]
        for path in sorted(EXAMPLES.glob("*.lisp"))
    }
    assert {name: warned for name, warned in found.items() if warned} == {
        # the pooler's mean in bf16, as transformers' bf16 ConvNextModel computes it
        "convnext.lisp": [(87, "(mean")],
        "energy.lisp": [(10, "(sum"), (10, "energy")],
        "gemma2.lisp": [(14, "'max-position-embeddings'")],
        "llama.lisp": [(12, "'max-position-embeddings'")],
        # the time step's softplus in bf16, as transformers' bf16 MambaMixer computes it
        "mamba.lisp": [(60, "(softplus")],
        "mixtral.lisp": [(16, "'max-position-embeddings'")],
        "modded-nanogpt-medium.lisp": [(15, "'max-seq-len'")],
    }


def test_a_call_bound_by_let_is_not_to_be_bound_again():
    source = """(defparam w (normal [4 4]))
(defun f (x) (matmul x w))
(defun forward (x)
  (let ((y (f x)))
    (exp y)))
(defrun train :precision :bf16)
"""
    assert messages(source) == [
        (
            5,
            5,
            "(exp y) computes in bf16 outside an f32 island, where its rounding errors "
            "grow; wrap it in (with-numerics (:sensitivity :high) ...)",
        )
    ]


CHAIN = """(defmodel block (&key (d 8))
  (defparam w (normal [d d] :std 0.02))
  (defun forward (x) (with-numerics (:sensitivity :high) (+ x (matmul x w)))))
(defparam emb (normal [16 8]))
(defparam blocks (stack 2 (block :d 8)))
(defun forward (ids)
  (let ((h (take emb ids)))
    (chain blocks START)))
(defrun train :precision :bf16)
"""


def test_a_chain_that_rounds_its_layers_f32_values_is_warned():
    """The layers give an island's f32 value; started from a bf16 embedding the loop
    carries bf16 (the join rule), rounding the residual stream after every layer."""
    assert messages(CHAIN.replace("START", "h")) == [
        (
            8,
            5,
            "the loop carries bf16 because h is bf16 here: cast it to f32 before the "
            "chain if the residual stream should stay f32",
        )
    ]
    code = compile_source(CHAIN.replace("START", "h"), "m.lisp")
    assert "h = layer(h).to(torch.bfloat16)" in code


def test_a_chain_started_in_f32_carries_f32_and_is_not_warned():
    source = CHAIN.replace("START", "(cast h :f32)")
    assert messages(source) == []
    assert "h = layer(h)\n" in compile_source(source, "m.lisp")
