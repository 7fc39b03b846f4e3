"""The dtypes a gradient's backward computes in under :bf16, against plain PyTorch."""

from __future__ import annotations

import torch


def test_the_backward_of_a_high_parameters_reader_reads_it_in_f32(build):
    """The forward (matmul x w1) computes in f32 from w1's master; its backward carries
    that mark, so grad @ w1^T reads the master too: 0.501953125 with w1 = 1 + 2^-8, where
    the rounded w1 (1.0) gave 0.5."""
    source = """
(defparam w1 (normal [4 4]) :numerics :high)
(defparam w2 (normal [4 4]))
(defun grad-x (x) (gradient (mean (matmul (matmul x w1) w2)) x))
(defun forward (x) (grad-x x))
(defrun train :precision :bf16)
"""
    for target in ("cuda", "cpu"):
        module, _ = build(source, target=target)
        model = module.Model()
        with torch.no_grad():
            model.w1.fill_(1 + 2**-8)
            model.w2.copy_(torch.eye(4))
        x = torch.randn(2, 4)
        # d mean / dx = (1/8) ones @ w2^T @ w1^T: each entry 4 * (1/8) * (1 + 2^-8)
        expected = torch.full((2, 4), 1 / 8) @ model.w1.detach().T
        assert expected[0, 0].item() == 0.501953125
        assert torch.equal(model(x), expected)


def test_a_gradient_has_the_dtype_its_backward_computes_in(build):
    """The golden case gradient-dtype: bf16 through a parameter under :bf16, even for an
    f32 x; a cast gives f32; without a parameter x's f32 stays."""
    from pathlib import Path

    source = Path(__file__).parents[2] / "golden" / "gradient-dtype.lisp"
    module, _ = build(source.read_text(), "gradient-dtype.lisp")
    model = module.GradientDtype()
    x = torch.randn(3, 4)
    w = model.w.detach().bfloat16()
    expected = torch.ones(3, 4, dtype=torch.bfloat16) @ w.T
    assert model(x).dtype == torch.bfloat16
    assert torch.equal(model(x), expected)
    assert torch.equal(model.as_f32(x), expected.float())
    assert torch.equal(model.plain(x), 2 * x)


def test_the_backward_of_fused_rms_norm_is_one_kernel_rounded_once(build):
    """As torch's backward of F.rms_norm on bf16 input: f32 inside, dX and dWEIGHT each
    rounded once to bf16 (known-7 of the difftest corpus: the rule wrote it out in ops,
    its cancelling difference rounded to bf16 at each step)."""
    source = """
(defparam v (normal [4]))
(defparam w (normal [4 4]))
(defun forward (x) (gradient (sum (matmul (fused-rms-norm x v) w)) x))
(defun weight (x) (gradient (sum (matmul (fused-rms-norm x v) w)) v))
(defrun train :precision :bf16)
"""
    module, _ = build(source)
    model = module.Model()
    torch.manual_seed(1)
    x = torch.randn(3, 4) * 4
    bf = torch.bfloat16
    xb = x.to(bf).requires_grad_()
    vb = model.v.detach().to(bf).requires_grad_()
    out = torch.nn.functional.rms_norm(xb, (4,), vb) @ model.w.detach().to(bf)
    dx, dv = torch.autograd.grad(out.sum(), [xb, vb])
    got = model(x)
    assert got.dtype == bf and torch.equal(got, dx)
    assert torch.equal(model.weight(x).to(bf), dv)


def test_a_passed_on_gradient_is_summed_back_in_its_own_dtype(build):
    """corpus rule-pass-through-sum-back: (- x v) of a high v passes the bf16 gradient of
    the matmul on to x; x's rank is not known, so a sum back is written, and it is made
    where the gradient was (bf16), not in the `-` node's marks (f32)."""
    module, code = build(
        "(defparam v (normal [4]) :numerics :high)\n(defparam w (normal [4 4]))\n"
        "(defun forward (x) (gradient (sum (matmul (- x v) w)) x))\n"
        "(defrun train :precision :bf16)\n"
    )
    assert "grad_x = grad_sub_x.sum_to_size(x.shape)" in code
    model = module.Model()
    got = model(torch.randn(2, 4))
    w = model.w.detach().to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, torch.ones(2, 4, dtype=torch.bfloat16) @ w.T)
