"""A top-level defun that sub-models call is one module-level function, written once for
each body the program needs, and called by name from every class: not a method copied into
each class that calls it."""

from __future__ import annotations

import re

import torch

from tests.bitwise import assert_same

TWO_MODELS = """
(defun soft (x) (log (+ 1.0 (exp x))))

(defmodel up (&key (d 4))
  (defparam w (normal [d d]))
  (defun forward (x) (soft (matmul x w))))

(defmodel down (&key (d 4))
  (defparam w (normal [d d]))
  (defun forward (x) (* 2.0 (soft (matmul x w)))))

(defparam a (up))
(defparam b (down))
(defun forward (x) (b (a x)))
(defrun train :precision :bf16)
"""


def test_a_defun_two_classes_call_is_one_module_level_function(build):
    module, code = build(TWO_MODELS)
    assert len(re.findall(r"^def soft\(x\):$", code, re.M)) == 1
    assert "def soft(self" not in code
    assert "return soft(x.to(torch.bfloat16) @ w_bf16)" in code
    assert "return 2.0 * soft(x @ w_bf16)" in code
    torch.manual_seed(0)
    model = module.Model()
    x = torch.randn(3, 4)

    def soft(v):
        return torch.log(1.0 + torch.exp(v))

    w_a, w_b = model.a.w.to(torch.bfloat16), model.b.w.to(torch.bfloat16)
    assert_same(model(x), 2.0 * soft(soft(x.to(torch.bfloat16) @ w_a) @ w_b))
    assert_same(module.soft(x), soft(x.to(torch.bfloat16)))


def test_a_defun_that_calls_a_models_own_defun_stays_its_method(build):
    """`twice` calls `inner`, which `up` defines itself: in `up`, twice is a method reading
    up's inner, so it is no function of its arguments alone."""
    module, code = build("""
(defun inner (x) (* x 3.0))
(defun twice (x) (inner (inner x)))
(defmodel up (&key (d 4))
  (defparam w (normal [d d]))
  (defun inner (x) (+ x 1.0))
  (defun forward (x) (twice (matmul x w))))
(defparam a (up))
(defun forward (x) (twice (a x)))
(defrun train :precision :f32)
""")
    assert "return self.inner(self.inner(x))" in code
    model = module.Model()
    x = torch.randn(3, 4)
    assert_same(model(x), (x @ model.a.w + 1.0 + 1.0) * 3.0 * 3.0)


def test_a_defun_reading_the_training_mode_stays_a_method(build):
    """dropout reads `self.training`, which only a method has."""
    module, code = build("""
(defun drop (x) (dropout x 0.5))
(defmodel up (&key (d 4))
  (defparam w (normal [d d]))
  (defun forward (x) (drop (matmul x w))))
(defparam a (up))
(defun forward (x) (drop (a x)))
(defrun train :precision :f32)
""")
    assert "def drop(self, x):" in code
    model = module.Model().eval()
    x = torch.randn(3, 4)
    assert_same(model(x), x @ model.a.w)
