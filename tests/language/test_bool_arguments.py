"""A public method's argument that an op reads as a mask keeps its kind (issue 38, item 1):
attention's MASK is booleans (True: attend) or an additive float, and `where`'s condition is
booleans. A float mask is cast to the dtype attention computes in; a boolean one is passed
as it is, never made a 0/1 float that SDPA would add to the scores. Each entry of the module
(the top model's forward, a sub-model's public forward, a defun whose public method casts
its arguments down at entry), with a bool and with a float mask, against plain PyTorch."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

HEAD = """(defparam w (normal [8 8]))
(defmodel attend ()
  (defun forward (q mask) (attention q q q mask)))
(defparam inner (attend))
"""
RUN = "(defrun train :precision :bf16)\n"

# forward's argument read as the mask directly, through a reshape, and by a sub-model
DIRECT = "(defun forward (x mask) (attention (matmul x w) (matmul x w) (matmul x w) mask))"
RESHAPED = (
    "(defun forward (x mask) (let ((q (matmul x w))) (attention q q q (reshape mask [2 1 5]))))"
)
SUBMODEL = "(defun forward (x mask) (inner (matmul x w) mask))"
# reshaped inside a bf16 region, which reads its float inputs cast down
REGION = """(defun forward (x mask)
  (let ((q (matmul x w)))
    (with-numerics (:precision :bf16) (attention q q q (reshape mask [2 1 5])))))"""
# a defun whose public method is the bf16 one, casting both arguments at entry (forward's
# explicit cast makes a boolean a 0/1 float, as the source says)
ENTRY = """(defun pick (q mask) (attention q q q mask))
(defun forward (x mask) (pick (matmul x w) (cast mask :bf16)))"""


def masks() -> dict:
    keep = torch.tensor([[True] * 5, [True, True, True, False, False]])
    additive = torch.zeros(2, 5).masked_fill(~keep, -torch.inf)
    return {"bool": keep, "float": additive}


def reference(model, x, mask):
    """SDPA on the bf16 projection: a boolean mask as it is, a float one in bf16."""
    q = x.to(torch.bfloat16) @ model.w.to(torch.bfloat16)
    if mask.is_floating_point():
        mask = mask.to(torch.bfloat16)
    return F.scaled_dot_product_attention(q, q, q, attn_mask=mask.reshape(2, 1, 5))


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize(
    "forward",
    [DIRECT, RESHAPED, SUBMODEL, REGION],
    ids=["direct", "reshaped", "submodel", "region"],
)
def test_every_entry_takes_a_bool_mask_as_booleans(build, forward, kind, target):
    module, code = build(HEAD + forward + "\n" + RUN, target=target)
    torch.manual_seed(0)
    model = module.Model()
    x = torch.randn(2, 5, 8)
    mask = masks()[kind]
    wanted = reference(model, x, mask)
    # the mask [B S] broadcast against the scores [B T S] as [B 1 S]
    given = mask if forward in (RESHAPED, REGION) else mask.reshape(2, 1, 5)
    got = model(x, given)
    assert torch.equal(got.float(), wanted.float()), code


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_public_method_called_from_outside_takes_either_mask(build, kind, target):
    """`pick`, called by the program only with bf16, casts its f32 arguments at entry:
    its mask only if it is a float."""
    module, code = build(HEAD + ENTRY + "\n" + RUN, target=target)
    torch.manual_seed(0)
    model = module.Model()
    q = torch.randn(2, 5, 8)
    mask = masks()[kind].reshape(2, 1, 5)
    wanted = F.scaled_dot_product_attention(
        *[q.to(torch.bfloat16)] * 3,
        attn_mask=mask.to(torch.bfloat16) if kind == "float" else mask,
    )
    assert torch.equal(model.pick(q, mask).float(), wanted.float()), code
    sub = model.inner(q.to(torch.bfloat16), mask)
    assert torch.equal(sub.float(), wanted.float()), code


def test_a_where_condition_argument_is_taken_as_booleans(build):
    """`where`'s condition is booleans: an argument that is one is taken as passed."""
    module, code = build(
        "(defparam w (normal [8 8]))\n(defun forward (x c) (where c (matmul x w) 0.0))\n"
        + RUN
    )
    torch.manual_seed(0)
    model = module.Model()
    x, c = torch.randn(3, 8), torch.randn(3, 8) > 0
    wanted = torch.where(c, x.to(torch.bfloat16) @ model.w.to(torch.bfloat16), 0.0)
    assert torch.equal(model(x, c), wanted), code
