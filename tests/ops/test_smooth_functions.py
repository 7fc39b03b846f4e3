"""softplus, log1p and expm1: torch's kernels in f32 and, under :bf16, their f32 value
rounded once (as exp and log), on every target, the interpreter agreeing bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sx2torch import interpret

FUNCTIONS = {
    "(softplus x)": F.softplus,
    "(softplus x :beta 2.0 :threshold 10)": lambda x: F.softplus(x, 2.0, 10),
    "(log1p x)": torch.log1p,
    "(expm1 x)": torch.expm1,
}


def every_finite_bf16() -> torch.Tensor:
    """The 65,024 finite bf16 numbers, as f32."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16)
    return x[torch.isfinite(x)].float()


def _same(got, want) -> bool:
    """Equal bits, NaN where torch gives NaN (log1p below -1)."""
    return torch.equal(got.isnan(), want.isnan()) and torch.equal(
        got[~got.isnan()], want[~want.isnan()]
    )


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("form", sorted(FUNCTIONS))
def test_under_bf16_each_is_its_f32_value_rounded_once_as_torch_computes_it(
    build, form, target
):
    """A bf16 input gives torch's bf16 kernel's value (which computes in f32 and rounds
    once: checked here on every finite bf16 number), the held target's f32 computation
    rounded on store, and the interpreter's value, alike."""
    source = f"(defun forward (x) {form.replace(' x', ' (cast x :bf16)', 1)})\n"
    source += "(defrun train :precision :bf16)\n"
    module, _ = build(source, target=target)
    x = every_finite_bf16()
    got = module.Model()(x)
    torch_kernel = FUNCTIONS[form](x.bfloat16())
    rounded_once = FUNCTIONS[form](x).bfloat16()
    assert _same(torch_kernel.float(), rounded_once.float())
    assert _same(got.float(), rounded_once.float())
    interpreted = interpret.load(source).evaluate("forward", [x], rounded_once=True)
    assert _same(interpreted.float(), rounded_once.float())


def test_softplus_is_linear_past_its_threshold_where_log_of_one_plus_exp_overflows(
    build,
):
    """Mamba's dt at x = 100: softplus gives 100 (in bf16 too: 100 is one of the numbers
    the test above runs); log(1 + exp x), the workaround it replaces, gives inf."""
    source = """
(defun forward (x) (softplus x))
(defun written-out (x) (log (+ 1.0 (exp x))))
(defrun train :precision :f32)
"""
    module, _ = build(source)
    model = module.Model()
    x = torch.tensor([100.0, -100.0, 0.0])
    assert torch.equal(model(x), F.softplus(x)) and model(x)[0].item() == 100.0
    assert torch.isinf(model.written_out(x)[0])


def test_log1p_and_expm1_keep_the_digits_log_and_exp_lose_near_zero(build):
    module, _ = build(
        "(defun forward (x) (+ (log1p x) (expm1 x)))\n"
        "(defun written-out (x) (+ (log (+ 1.0 x)) (- (exp x) 1.0)))\n"
    )
    x = torch.tensor([1e-10, -3e-9])
    model = module.Model()
    assert torch.equal(model(x), torch.log1p(x) + torch.expm1(x))
    torch.testing.assert_close(model(x), 2 * x, rtol=1e-6, atol=0)
    assert torch.equal(model.written_out(x), torch.zeros(2))


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_the_bf16_gradients_are_the_interpreters(build, target):
    """Under :bf16 each derivative rule is written out in ops that each round (softplus's
    where and sigmoid, log1p's g / (x + 1), expm1's g (y + 1)); the interpreter writes the
    same formulas, so the gradients agree bit for bit."""
    source = """
(defparam w (normal [4 4]))
(defun forward (x)
  (let ((h (matmul x w)))
    (gradient (sum (* (+ (softplus h :beta 2.0 :threshold 3) (log1p (abs h)) (expm1 h)) h))
              w)))
(defrun train :precision :bf16)
"""
    module, _ = build(source, target=target)
    model = module.Model()
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    state = {"w": model.w.detach()}
    interpreted = interpret.load(source, state=state)
    want = interpreted.evaluate("forward", [x], rounded_once=True)
    got = model(x)
    assert want.dtype == torch.bfloat16
    assert torch.equal(got.float(), want.float())
