"""arange-of and linspace: tensors made when the module runs, sized by the input, f32 under
either policy; with them the rotary tables of modded-nanogpt's GPTs equal the real ones.
"""

from __future__ import annotations

import pytest
import torch

from reference import modded_nanogpt_medium as medium
from reference import modded_nanogpt_simple as simple

RUNS = [("exact", "cuda"), ("exact", "cpu"), ("fast", "cuda"), ("fast", "cpu")]
DEFRUNS = "(defrun exact :precision :f32)\n(defrun fast :precision :bf16)\n"


def ids(batch: int, length: int) -> torch.Tensor:
    return torch.zeros(batch, length, dtype=torch.long)


@pytest.mark.parametrize("run, target", RUNS)
def test_arange_of_follows_the_length_when_the_module_runs(build, run, target):
    module, code = build(
        "(defun forward (x) (arange-of x :axis 1))\n" + DEFRUNS,
        "m.lisp",
        run=run,
        target=target,
    )
    assert "torch.arange(x.shape[1], dtype=torch.float32, device=x.device)" in code
    for length in (7, 40, 300):
        got = module.M()(ids(2, length))
        assert torch.equal(got, torch.arange(length, dtype=torch.float32))


def test_arange_of_is_bf16_in_a_bf16_region_on_cuda(build):
    module, code = build(
        "(defun forward (x) (with-numerics (:precision :bf16) (arange-of x)))\n",
        "m.lisp",
    )
    assert torch.equal(module.M()(ids(1, 5)), torch.arange(5, dtype=torch.bfloat16))


@pytest.mark.parametrize("run, target", RUNS)
def test_linspace_steps_from_a_constructor_argument(build, run, target):
    text = "(defconst steps 8)\n(defun forward (x) (linspace x 0.0 1.0 steps))\n"
    module, code = build(text + DEFRUNS, "m.lisp", run=run, target=target)
    assert "0.0, 1.0, self.steps, dtype=torch.float32, device=x.device" in code
    x = torch.zeros(3)
    assert torch.equal(module.M()(x), torch.linspace(0, 1, 8))
    assert torch.equal(module.M(steps=5)(x), torch.linspace(0.0, 1.0, 5))


ROTARY = """
(defconst head-dim 32)
(defun angles (ids)
  "modded-nanogpt's half-truncated RoPE: positions times (1/1024)^linspace(0, 1)."
  (let ((freq (pow (/ 1.0 1024) (linspace ids 0.0 1.0 (// head-dim 4))))
        (freq (concat [freq (zeros-like freq)] :axis 0)))
    (outer (arange-of ids :axis 1) freq)))
(defun forward (ids) (cos (angles ids)))
(defun sine (ids) (sin (angles ids)))
(defun medium-cos (ids) (cast (cos (angles ids)) :bf16))
(defun medium-sin (ids) (cast (sin (angles ids)) :bf16))
"""


@pytest.mark.parametrize("length", [64, 40])
@pytest.mark.parametrize("run", ["exact", "fast"])
def test_rotary_tables_equal_the_real_models(build, run, length):
    module, _ = build(ROTARY + DEFRUNS, "m.lisp", run=run)
    model, x = module.M(), ids(2, length)
    yarn = medium.Yarn(32, max_seq_len=4096)
    assert torch.equal(model.medium_cos(x), yarn.cos[:length])
    assert torch.equal(model.medium_sin(x), yarn.sin[:length])
    rotary = simple.Rotary(32)
    theta = torch.outer(torch.arange(length, dtype=torch.float32), rotary.angular_freq)
    assert model(x).dtype == torch.float32
    assert torch.equal(model(x), theta.cos())
    assert torch.equal(model.sine(x), theta.sin())


@pytest.mark.parametrize("run, target", RUNS)
def test_arange_is_torch_arange_with_a_const_end(build, run, target):
    """transformers' rotary exponents, torch.arange(0, dim, 2) / dim, with dim a constructor
    argument; f32 under either policy."""
    text = "(defconst dim 16)\n(defun forward (x) (/ (arange x 0 dim 2) dim))\n"
    module, code = build(text + DEFRUNS, "m.lisp", run=run, target=target)
    assert "torch.arange(0, self.dim, 2, dtype=torch.float32, device=x.device)" in code
    x = torch.zeros(3)
    for dim in (16, 128, 10):
        want = torch.arange(0, dim, 2, dtype=torch.float32) / dim
        assert torch.equal(module.M(dim=dim)(x), want)
