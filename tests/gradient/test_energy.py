"""energy.lisp: forces by `gradient`, trained by `loss.backward()` through the emitted backward."""

from __future__ import annotations

import pytest
import torch

from cases import EXAMPLES

EXAMPLE = (EXAMPLES / "energy.lisp").read_text()


def with_precision(precision: str) -> str:
    return EXAMPLE.replace(
        "(defrun train :precision :bf16)", f"(defrun train :precision :{precision})"
    )


def reference_energy(pos, w1, w2):
    return (torch.tanh(pos @ w1) @ w2).sum()


def reference_forces(pos, w1, w2, create_graph=False):
    pos = pos.detach().requires_grad_()
    (grad,) = torch.autograd.grad(
        reference_energy(pos, w1, w2), pos, create_graph=create_graph
    )
    return -grad


def model_and_data(build, precision):
    module, _ = build(with_precision(precision), "energy.lisp")
    torch.manual_seed(0)
    model = module.Energy()
    pos = torch.randn(32, 3)
    return model, pos


def test_forces_under_f32_equal_autograd_of_a_reference(build):
    model, pos = model_and_data(build, "f32")
    expected = reference_forces(pos, model.w1.detach(), model.w2.detach())
    torch.testing.assert_close(model(pos), expected, rtol=1e-6, atol=1e-6)


def test_parameter_gradients_through_the_emitted_backward_match_double_backward(build):
    model, pos = model_and_data(build, "f32")
    target = torch.randn(32, 3)
    loss = model.loss(pos, target)
    got = torch.autograd.grad(loss, [model.w1, model.w2])
    w1, w2 = (p.detach().clone().requires_grad_() for p in (model.w1, model.w2))
    ref_loss = ((reference_forces(pos, w1, w2, create_graph=True) - target) ** 2).mean()
    expected = torch.autograd.grad(ref_loss, [w1, w2])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_force_matching_trains(build, precision):
    model, pos = model_and_data(build, precision)
    torch.manual_seed(1)
    teacher_w1, teacher_w2 = torch.randn(3, 64) * 0.5, torch.randn(64, 1) * 0.1
    target = reference_forces(pos, teacher_w1, teacher_w2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(100):
        optimizer.zero_grad()
        loss = model.loss(pos, target)
        loss.backward()
        optimizer.step()
        first = loss.item() if first is None else first
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    assert model.loss(pos, target).item() <= 0.5 * first


SWEEP = """
(defparam w1 (normal [3 16] :std 0.5))
(defparam w2 (normal [16 1] :std 0.1))
(defun energy (pos) (sum (matmul (tanh (matmul pos w1)) w2)))
(defun plain (pos) (gradient (energy pos) pos))
(defun stamped (pos) (with-numerics (:sensitivity :high) (gradient (energy pos) pos)))
(defun forward (pos) (plain pos))
(defrun train :precision :bf16)
"""


def test_bf16_sweep_follows_the_forward_marks_and_a_stamp_makes_it_f32(build):
    module, code = build(SWEEP)
    torch.manual_seed(0)
    model = module.__dict__[module.__all__[0]]()
    pos = torch.randn(8, 3)
    plain, stamped = model.plain(pos), model.stamped(pos)
    assert plain.dtype == torch.bfloat16
    assert stamped.dtype == torch.float32
    assert not torch.equal(
        stamped, stamped.to(torch.bfloat16).float()
    ), "the f32 sweep is not rounded to bf16"
    # The f32 sweep over the same bf16 forward values, by hand.
    w1, w2 = model.w1.detach(), model.w2.detach()
    tanh = torch.tanh(pos.to(torch.bfloat16) @ w1.to(torch.bfloat16)).float()
    expected = ((torch.ones(8, 1) @ w2.T) * (1 - tanh * tanh)) @ w1.T
    torch.testing.assert_close(stamped, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        plain.float(), expected, rtol=0.05, atol=0.01
    )  # bf16 sweep: within bf16 rounding


# Issue 40 item 9: a value read by several forms, its gradient a sum of their contributions.
SHARED = """
(defmodel blk (&key (d 4))
  (defparam w (normal [d d]))
  (defun forward (x)
    (minimum (+ (cast x :f32) (let ((t1 x)) t1)) (+ (* x x) (cast x :f32)))))
(defparam w1 (normal [4 4]))
(defparam v1 (normal [4]) :numerics :high)
(defparam one (blk :d 4))
(defparam blocks (stack (i 2) (blk :d 4)))
(defun energy (x)
  (sum (/ (* (one x) (linear (* x -1.0) w1 v1) (matmul x w1))
          (+ (abs (neg (for (i layer blocks) ((h2 x)) (layer (* h2 -1.0))))) 1.0))))
(defun grad-x (x) (gradient (energy x) x))
(defun forward (x) x)
(defrun train :precision :f32)
"""


def test_an_f32_gradient_sums_contributions_as_accurately_as_autograd(build):
    """Under :f32 the gradient sums a value's contributions in the order its readers are
    traced, autograd in the order its engine runs them: the last bit may differ
    (docs/LANGUAGE.md, gradient), each within f32's rounding of the f64 gradient."""
    module, _ = build(SHARED, "shared.lisp")
    model = module.Shared()
    wide = module.Shared().double()
    wide.load_state_dict(model.state_dict())
    for seed in range(20):
        torch.manual_seed(seed)
        x = torch.randn(3, 4)
        x64 = x.double().requires_grad_()
        (truth,) = torch.autograd.grad(wide.energy(x64), x64)
        (autograd,) = torch.autograd.grad(model.energy(x.requires_grad_()), x)
        got = model.grad_x(x.detach())
        scale = truth.abs().max()
        ours = (got.double() - truth).abs().max() / scale
        theirs = (autograd.double() - truth).abs().max() / scale
        assert ours <= 2 * theirs + 2**-22
