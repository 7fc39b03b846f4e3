"""The activation's dtype as a value (issue 20, item 9): `(scalar-like X V)` is V rounded to
the dtype X computes in, as Gemma's torch.tensor(hidden**0.5, dtype=x.dtype), and
`(cast-run X)` is X in the run's dtype: bf16 under :bf16, the identity under :f32."""

from __future__ import annotations

import pytest
import torch

from cases import lisp
from sx2torch import interpret
from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError

DTYPES = {"train": torch.bfloat16, "exact": torch.float32}


def reference(model, ids, dtype):
    """Gemma's embedding scale and Gemma2RMSNorm, as transformers writes them."""
    h = model.wte.to(dtype)[ids]
    h = h * torch.tensor(48**0.5, dtype=h.dtype)
    x = h.float()
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (out * (1.0 + model.weight.float())).type_as(h)


@pytest.mark.parametrize("target", ["cuda", "metal"])
@pytest.mark.parametrize("run", ["train", "exact"])
def test_the_scale_and_the_norm_are_gemmas_bit_for_bit(build, run, target):
    source = lisp("dtype-values").read_text()
    module, code = build(source, "dtype-values.lisp", run=run, target=target)
    torch.manual_seed(0)
    model = module.DtypeValues()
    with torch.no_grad():
        model.weight.normal_()
    ids = torch.randint(0, 10, (2, 7))
    got, expected = model(ids), reference(model, ids, DTYPES[run])
    if target == "cuda":
        assert got.dtype == DTYPES[run]
    assert torch.equal(got.to(expected.dtype), expected)
    interpreted = interpret.load(
        source, "dtype-values.lisp", run=run, state=model.state_dict()
    )
    assert torch.equal(interpreted("forward", ids).to(expected.dtype), expected)


def test_an_unrounded_scale_is_another_number(build):
    """What the rounding is for: 48**0.5 = 6.928... is 6.9375 in bf16, and a bf16 product
    with the unrounded number rounds otherwise."""
    module, _ = build(
        "(defun forward (x) (let ((h (cast x :bf16))) (* h (scalar-like h 6.928203230275509))))"
        "(defrun r :precision :bf16)"
    )
    h = torch.randn(1000, generator=torch.Generator().manual_seed(0)).bfloat16()
    got = module.Model()(h)
    assert torch.equal(got, h * torch.tensor(6.9375, dtype=torch.bfloat16))
    assert not torch.equal(got, h * 6.928203230275509)


@pytest.mark.parametrize(
    ("precision", "dtype"), [("f32", torch.float32), ("bf16", torch.bfloat16)]
)
def test_cast_run_is_the_runs_dtype(build, precision, dtype):
    source = (
        "(defun forward (x) (cast-run x))\n"
        "(defun marked (x) (with-numerics (:sensitivity :high) (cast-run x)))\n"
        f"(defrun r :precision :{precision})\n"
    )
    module, code = build(source)
    x = torch.randn(5)
    model = module.Model()
    assert model(x).dtype == dtype and torch.equal(model(x), x.to(dtype))
    assert model.marked(x).dtype == torch.float32  # an island computes in f32
    assert ("x.to(torch.bfloat16)" in code) == (precision == "bf16")


def test_cast_run_of_integers_is_a_diagnostic():
    with pytest.raises(SourceError) as raised:
        compile_source("(defun forward (ids) (cast-run (positions ids)))", "m.lisp")
    assert (
        raised.value.message == "'cast-run' needs a float tensor, got an integer tensor"
    )
