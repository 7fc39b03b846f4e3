"""A gradient's seed computes nothing for its shape (issue 22 item 4): ones of a matmul's
shape come from its operands' shapes, a full mean's are ones over the count of its input,
and a sum's or a concat's rule reading ones gives ones of its operand's shape; the values
are autograd's, whatever X's rank."""

from __future__ import annotations

import pytest
import torch

from conftest import method_code as method, seeded_model

SOURCE = """
(defparam w (normal [4 5]))
(defun by-w (x) (gradient (sum (matmul x w)) x))
(defun of-mean (x) (gradient (mean (tanh x)) x))
(defun of-sums (x) (gradient (+ (sum (* x x)) (sum (tanh x))) x))
(defun of-concat (x) (gradient (sum (concat [x (tanh x)] :axis -1)) x))
(defun forward (x) (by-w x))
"""


@pytest.fixture(scope="module")
def built():
    return seeded_model(SOURCE)


@pytest.mark.parametrize(
    "name, absent",
    [
        ("by_w", "@ self.w,"),  # no matmul for ones_like to read
        ("of_mean", "torch.mean"),
        ("of_sums", "torch.sum"),
        ("of_concat", "torch.cat"),
    ],
)
def test_a_seed_computes_nothing_for_its_shape(built, name, absent):
    _, code = built
    body = method(code, name)
    assert absent not in body and "ones_like(torch" not in body, body


@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4)])
def test_the_seeded_gradients_are_autograds(built, shape):
    model, _ = built
    x = torch.randn(*shape).requires_grad_()
    w = model.w.detach()
    expected = {
        "by_w": (x @ w).sum(),
        "of_mean": torch.tanh(x).mean(),
        "of_sums": (x * x).sum() + torch.tanh(x).sum(),
        "of_concat": torch.cat([x, torch.tanh(x)], dim=-1).sum(),
    }
    for name, y in expected.items():
        (want,) = torch.autograd.grad(y, x)
        got = getattr(model, name)(x.detach())
        assert got.shape == x.shape
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=name)
