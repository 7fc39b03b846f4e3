"""defrun's training keys: parsed values, located diagnostics, and the main block they emit."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sx2torch import resolve
from sx2torch.syntax import read
from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError
from sx2torch.syntax.program import Program

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MLP = """\
(defmodel layer (&key (d 4))
  (defparam w (normal [d d]))
  (defparam g (ones [d]))
  (defparam t (eye d) :trainable false)
  (defun forward (x) (* (matmul x w) g)))
(defconst d 4)
(defparam emb (normal [d d]))
(defparam layers (stack 2 (layer :d d)))
(defparam one (layer :d d))
(defun forward (x) (one (chain layers (matmul x emb))))
(defun loss (x labels) (cross-entropy (forward x) labels))
"""


def program(text: str) -> Program:
    return resolve.run(read.run(text), "net")


def error(text: str) -> tuple:
    with pytest.raises(SourceError) as caught:
        program(text)
    return caught.value.span.line, caught.value.span.col, caught.value.message


def settings(code: str) -> tuple:
    """(class name, settings dict) of the `train.main(...)` call in a generated main block."""
    main = [n for n in ast.parse(code).body if isinstance(n, ast.If)]
    assert len(main) == 1
    call = main[0].body[-1].value
    return call.args[0].id, ast.literal_eval(call.args[1])


def test_keys_are_read():
    run = program(
        MLP + "(defrun r :precision :bf16 :loss loss :steps 7 :grad-clip 0.5\n"
        "  :optimizer (muon :lr 0.02 :nesterov false :adamw (adamw :betas [0.8 0.95]))\n"
        "  :schedule (:warmup 0.1 :cooldown 0.3) :inputs ((x [8 d]) (labels [8] :high 4)))"
    ).runs[0]
    assert (run.loss.name, run.steps, run.grad_clip, run.warmup, run.cooldown) == (
        "loss",
        7,
        0.5,
        0.1,
        0.3,
    )
    assert run.optimizer.settings == {"lr": 0.02, "nesterov": False}
    assert run.optimizer.rest.settings == {"betas": (0.8, 0.95)}
    assert [(i.name.name, i.shape, i.high) for i in run.inputs] == [
        ("x", (8, 4), None),
        ("labels", (8,), 4),
    ]


@pytest.mark.parametrize(
    ("run", "col", "message"),
    [
        ("(defrun r :steps 3)", 18, "defrun :steps needs :loss (the defun to train)"),
        ("(defrun r :loss lost :inputs ((x [1])))", 17, "unknown defun 'lost' for :loss (known: forward, loss)"),
        ("(defrun r :loss forward :batch-size 2 :seq-len 2)", 17, "defun 'forward' takes 1 arguments; on token data the loss takes (inputs targets): give :inputs for other data"),
        ("(defrun r :loss loss :batch-size 2)", 9, "defrun 'r' trains on token data: it needs :seq-len"),
        ("(defrun r :loss loss :steps 0 :inputs ((x [1])))", 29, ":steps must be a positive integer, got 0"),
        ("(defrun r :loss loss :steps 2.5 :inputs ((x [1])))", 29, ":steps must be a positive integer, got 2.5"),
        ("(defrun r :loss loss :optimizer (sgd :lr 1))", 34, "unknown optimizer 'sgd' (known: adamw, muon)"),
        ("(defrun r :loss loss :optimizer adamw)", 33, "expected an optimizer such as (adamw :lr X ...) or (muon :lr X ...)"),
        ("(defrun r :loss loss :optimizer (adamw :lr -1))", 44, ":lr of adamw must be greater than 0, got -1"),
        ("(defrun r :loss loss :optimizer (adamw :betas [0.9]))", 47, ":betas of adamw must be a vector [B1 B2]"),
        ("(defrun r :loss loss :optimizer (adamw :betas [0.9 1]))", 52, ":betas of adamw must be less than 1, got 1"),
        ("(defrun r :loss loss :optimizer (adamw :momentum 0.9))", 40, "unknown keyword :momentum in (adamw ...) (known: :lr, :betas, :weight-decay, :eps)"),
        ("(defrun r :loss loss :optimizer (muon :adamw (muon)))", 47, "unknown optimizer 'muon' (known: adamw)"),
        ("(defrun r :loss loss :optimizer (muon :nesterov 1))", 49, ":nesterov of muon must be true or false"),
        ("(defrun r :loss loss :schedule (:warmup 0.6 :cooldown 0.6))", 32, ":warmup and :cooldown add up to more than 1"),
        ("(defrun r :loss loss :schedule (:decay 0.6))", 33, "unknown keyword :decay in :schedule (known: :warmup, :cooldown)"),
        ("(defrun r :loss loss :grad-clip :yes)", 33, ":grad-clip must be a number, got :yes"),
        ("(defrun r :loss loss :inputs ((labels [2]) (x [2])))", 30, ":inputs names (labels x) must be the arguments of 'loss' (x labels)"),
        ("(defrun r :loss loss :inputs ((x [2 0]) (labels [2])))", 32, "input 'x' needs a shape of positive sizes"),
        ("(defrun r :loss loss :inputs ((x [2 e]) (labels [2])))", 37, "'e' is not a constant: expected a number known at compile time"),
        ("(defrun r :loss loss :inputs ((x [2]) (labels [2] :high 0)))", 40, "input 'labels' needs :high above 0"),
        ("(defrun r :loss loss :inputs ((x [2]) (labels [2] :high 1.5)))", 57, ":high must be an integer, got 1.5"),
        ("(defrun r :loss loss :inputs ((x 2)))", 34, "expected a shape such as [64 d], got 2"),
    ],
)  # fmt: skip
def test_diagnostics(run, col, message):
    assert error(MLP + run) == (MLP.count("\n") + 1, col, message)


def test_a_run_without_loss_emits_no_main_block():
    code = compile_source(MLP + "(defrun r :precision :bf16)", "net.lisp")
    assert "__main__" not in code and "train" not in code


def test_settings_name_each_parameter_group():
    code = compile_source(
        MLP + "(defrun r :loss loss :steps 3 :optimizer (muon :lr 0.02)\n"
        "  :inputs ((x [8 d]) (labels [8] :high 4)))",
        "net.lisp",
    )
    assert settings(code) == (
        "Net",
        {
            "loss": "loss",
            "steps": 3,
            "inputs": {"x": {"shape": (8, 4)}, "labels": {"shape": (8,), "high": 4}},
            "optimizers": [
                {
                    "name": "muon",
                    "lr": 0.02,
                    "momentum": 0.95,
                    "weight_decay": 0.1,
                    "nesterov": True,
                    "ns_steps": 5,
                    "params": ["layers.*.w", "one.w"],
                },
                {
                    "name": "adamw",
                    "lr": 0.001,
                    "betas": (0.9, 0.999),
                    "eps": 1e-08,
                    "weight_decay": 0.01,
                    "params": ["emb", "layers.*.g", "one.g"],
                },
            ],
        },
    )


def test_tiny_gpt_main_block():
    code = (EXAMPLES / "tiny-gpt.py").read_text(encoding="utf-8")
    name, values = settings(code)
    assert name == "TinyGpt"
    assert (values["loss"], values["batch_size"], values["seq_len"]) == ("loss", 8, 64)
    muon, adamw = values["optimizers"]
    assert muon["params"] == [
        "blocks.*.w_qkv",
        "blocks.*.w_o",
        "blocks.*.w_up",
        "blocks.*.w_down",
    ]
    assert adamw["params"] == ["wte", "lm_head"]
