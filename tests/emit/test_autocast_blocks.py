"""An f32 island is written inside `torch.autocast(DEVICE, enabled=False)` only where that
changes what it computes when the module runs under an enabled autocast: where it makes a
GEMM (matmul, linear, attention, a convolution), which autocast runs in lower precision.
An island of elementwise ops and reductions on f32 values computes the same bits under an
enabled autocast with the block as without it (autocast's f32 ops keep f32 inputs as they
are), so it is written as its statements, under its source comment."""

from __future__ import annotations

import torch

NORM = """
(defparam w (normal [8 8]))
(defun forward (x)
  (let ((h (matmul x w)))
    (* h (with-numerics (:sensitivity :high)
           (rsqrt (+ (mean (* h h) :axes [-1] :keepdims true) 1e-6))))))
(defrun train :precision :bf16)
"""

GEMM = """
(defparam w (normal [8 8]))
(defun forward (x)
  (let ((h (matmul x w)))
    (with-numerics (:sensitivity :high) (matmul (exp h) w))))
(defrun train :precision :bf16)
"""


def under_autocast(model, x):
    """The model's value and gradient without and with an enabled autocast (the CPU's: the
    cuda file's code on this host; its GEMMs outside the island read bf16 either way)."""
    found = []
    for enabled in (False, True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            out = model(x)
        out.float().sum().backward()
        found.append((out, model.w.grad.clone()))
    return found


def test_an_island_without_a_gemm_is_written_without_the_block(build):
    module, code = build(NORM)
    assert "torch.autocast" not in code
    assert "# (with-numerics (:sensitivity :high) ...)\n" in code
    torch.manual_seed(0)
    (plain, plain_grad), (cast, cast_grad) = under_autocast(
        module.Model(), torch.randn(4, 8)
    )
    assert torch.equal(plain, cast) and torch.equal(plain_grad, cast_grad)


def test_an_island_with_a_gemm_keeps_autocast_disabled(build):
    """autocast would run the island's matmul in bf16: the block keeps it f32."""
    for target, device in (("cuda", "cuda"), ("cpu", "cpu")):
        _, code = build(GEMM, target=target)
        assert f'with torch.autocast("{device}", enabled=False):' in code
