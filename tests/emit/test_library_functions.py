"""Library functions (rms-norm, layer-norm, causal-attention, ...) are written once at module
level and called; their numbers and gradients are those of plain PyTorch written the same way,
and a use that a call would change by a bit stays written out in place."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from tests.bitwise import assert_same

ROOT = Path(__file__).resolve().parents[2]

NORMED = """
(defparam w (normal [8 8]))
(defun forward (x) (rms-norm (matmul x w)))
(defrun train :precision :bf16)
"""


def test_tiny_gpt_writes_rms_norm_once_and_calls_it(build):
    _, code = build((ROOT / "examples" / "tiny-gpt.lisp").read_text(), "tiny-gpt.lisp")
    assert len(re.findall(r"^def rms_norm\(x, \*, eps=1e-06\):$", code, re.M)) == 1
    assert len(re.findall(r"^def causal_attention\(q, k, v\):$", code, re.M)) == 1
    assert len(re.findall(r"(?<![\w.])rms_norm\(", code)) == 1 + 6
    assert "causal_attention(rms_norm(q), rms_norm(k), v)" in code
    assert (
        "# (rms-norm" not in code.split("class ")[1]
    )  # no island written out in a class


def test_a_call_computes_what_plain_pytorch_does_gradient_included(build):
    module, code = build(NORMED)
    assert "return rms_norm(x.to(torch.bfloat16) @ w_bf16)" in code
    torch.manual_seed(0)
    model = module.Model()
    x = torch.randn(4, 8)
    out = model(x)
    out.float().sum().backward()
    w = model.w.detach().clone().requires_grad_(True)
    h = x.to(torch.bfloat16) @ w.to(torch.bfloat16)
    h_f32 = h.float()
    inverse = torch.rsqrt(torch.mean(h_f32 * h_f32, dim=-1, keepdim=True) + 1e-6)
    expected = h * inverse.to(torch.bfloat16)
    expected.float().sum().backward()
    assert_same(out, expected)
    assert_same(model.w.grad, w.grad)


def test_bodies_that_differ_are_named_with_their_dtypes(build):
    module, code = build("""
(defparam w (normal [8 8]))
(defun forward (x)
  (let ((a (rms-norm x :eps 1e-5))
        (z (with-numerics (:precision :bf16) (rms-norm x))))
    (+ (matmul a w) z)))
(defrun train :precision :bf16)
""")
    assert "# rms-norm for x: f32\ndef rms_norm_f32(x, *, eps=1e-06):" in code
    assert (
        "# rms-norm for x: f32, called in a bf16 region\ndef rms_norm_f32_region("
        in code
    )
    assert "a = rms_norm_f32(x, eps=1e-05)" in code
    x = torch.randn(4, 8)
    a = x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-5)
    z = x.to(torch.bfloat16) * torch.rsqrt(
        torch.mean(x * x, dim=-1, keepdim=True) + 1e-6
    ).to(torch.bfloat16)
    model = module.Model()
    expected = (a.to(torch.bfloat16) @ model.w.to(torch.bfloat16)) + z
    assert_same(model(x), expected)


def test_a_local_of_the_functions_name_keeps_it_and_the_function_yields(build):
    _, code = build("""
(defparam w (normal [8 8]))
(defun other (rms-norm) (* rms-norm 2.0))
(defun forward (x) (let ((h (matmul x w))) (+ (other h) (rms-norm h))))
(defrun train :precision :bf16)
""")
    assert "def rms_norm_(x, *, eps=1e-06):" in code
    assert "def other(self, rms_norm):" in code
    assert "return self.other(h) + rms_norm_(h)" in code


def test_a_use_whose_cast_is_shared_stays_in_place(build):
    _, code = build("""
(defparam w (normal [8 8]))
(defun forward (x) (let ((h (matmul x w))) (+ (softmax h) (rms-norm h))))
(defrun train :precision :bf16)
""")
    # softmax's island and rms-norm read one h_f32: autograd sums their gradients in f32
    assert "def rms_norm" not in code and "# (rms-norm h)" in code


def test_a_use_the_backward_reads_into_stays_in_place(build):
    _, code = build("""
(defparam w (normal [8 8]))
(defun forward (x)
  (let ((h (rms-norm (matmul x w)))
        (g (gradient (sum h) x)))
    (+ g (layer-norm x))))
(defrun train :precision :bf16)
""")
    assert "def rms_norm" not in code and "# (rms-norm (matmul x w))" in code
    assert "return g + layer_norm(x).to(torch.bfloat16)" in code
