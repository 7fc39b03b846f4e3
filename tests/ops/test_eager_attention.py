"""eager-attention against transformers' own eager_attention_forward (Llama's), attention's
:softcap against Gemma 2's, and topk's :sorted false against torch.topk(sorted=False)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import eager_attention_forward

from sx2torch import interpret

SOURCE = """
(defun forward (q k v mask)
  (eager-attention (cast q :DTYPE) (cast k :DTYPE) (cast v :DTYPE) (cast mask :DTYPE)
                   :scale 0.5))
(defun scaled (q k v) (eager-attention q k v))
(defrun train :precision :PRECISION)
"""


def _inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    mask = torch.zeros(5, 5).masked_fill(torch.ones(5, 5).triu(1).bool(), -1e9)
    return q, k, v, mask[None, None]


def _transformers(q, k, v, mask, scaling):
    module = nn.Module()
    module.num_key_value_groups = 1
    out, _ = eager_attention_forward(module, q, k, v, mask, scaling)
    return out.transpose(
        1, 2
    )  # its output is [B, T, H, D]; the op's keeps [B, H, T, D]


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_under_bf16_it_is_transformers_eager_attention_bit_for_bit(build, target):
    source = SOURCE.replace("PRECISION", "bf16").replace("DTYPE", "bf16")
    module, code = build(source, target=target)
    q, k, v, mask = _inputs()
    want = _transformers(*(t.bfloat16() for t in (q, k, v, mask)), 0.5)
    got = module.Model()(q, k, v, mask)
    assert torch.equal(got.float(), want.float())
    interpreted = interpret.load(source).evaluate("forward", [q, k, v, mask])
    assert torch.equal(interpreted.float(), want.float())


def test_in_f32_it_is_transformers_eager_attention(build):
    module, code = build(SOURCE.replace("PRECISION", "f32").replace("DTYPE", "f32"))
    assert "torch.softmax" in code
    q, k, v, mask = _inputs()
    model = module.Model()
    assert torch.equal(model(q, k, v, mask), _transformers(q, k, v, mask, 0.5))
    want = _transformers(q, k, v, None, 4**-0.5)
    torch.testing.assert_close(model.scaled(q, k, v), want, rtol=0, atol=1e-6)


def test_topk_unsorted_is_torchs_order(build):
    source = (
        "(defun forward (x) (let (([v i] (topk x 3 :sorted false))) "
        "(/ v (sum v :axes [-1] :keepdims true))))\n"
    )
    module, code = build(source)
    assert "sorted=False" in code
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    values = torch.topk(x, 3, dim=-1, sorted=False).values
    assert torch.equal(module.Model()(x), values / values.sum(-1, keepdim=True))
    assert torch.equal(
        interpret.load(source).evaluate("forward", [x]), module.Model()(x)
    )


SOFTCAPPED = """
(defun forward (q k v)
  (attention (cast q :DTYPE) (cast k :DTYPE) (cast v :DTYPE) :causal true :softcap 2.0
             :scale 0.3 :window 2 :enable-gqa true))
(defrun train :precision :PRECISION)
"""


def _gemma2(q, k, v, dtype):
    """Gemma 2's eager_attention_forward, its mask as transformers builds it: the dtype's
    least value where the key is later than the query or 3 or more before it (a sliding
    window of 3)."""
    from transformers.models.gemma2.modeling_gemma2 import (
        eager_attention_forward as gemma2_attention,
    )

    module = nn.Module()
    module.num_key_value_groups, module.training = 2, False
    i, j = torch.arange(6)[:, None], torch.arange(6)
    hidden = (j > i) | (j <= i - 3)
    mask = torch.zeros(6, 6, dtype=dtype).masked_fill(hidden, torch.finfo(dtype).min)
    out, _ = gemma2_attention(
        module, *(t.to(dtype) for t in (q, k, v)), mask, scaling=0.3, softcap=2.0
    )
    return out.transpose(1, 2)


@pytest.mark.parametrize(
    "precision, target",
    [("f32", "cuda"), ("bf16", "cuda"), ("bf16", "cpu")],
)
def test_a_soft_capped_attention_is_gemma2s_eager_attention_bit_for_bit(
    build, precision, target
):
    """cuda computes in bf16; the cpu target holds bf16 in f32 and rounds as bf16 does; the
    interpreter computes the rule on its own."""
    source = SOFTCAPPED.replace("PRECISION", precision).replace("DTYPE", precision)
    module, code = build(source, target=target)
    assert "sx.eager_attention(" in code and "softcap=2.0" in code
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 6, 8, generator=g)
    k, v = (torch.randn(2, 2, 6, 8, generator=g) for _ in range(2))
    want = _gemma2(q, k, v, torch.float32 if precision == "f32" else torch.bfloat16)
    got = module.Model()(q, k, v)
    assert torch.equal(got.float(), want.float())
    interpreted = interpret.load(source).evaluate("forward", [q, k, v])
    assert torch.equal(interpreted.float(), want.float())
