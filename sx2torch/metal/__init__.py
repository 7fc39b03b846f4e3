"""What is specific to Apple's MPS backend, the `--target metal` device (LANGUAGE.md 7).

Generated metal modules need nothing from here to run: they hold bf16 values in
f32 tensors, which every device has, and round with ``sx.round_to_bf16``, which
is integer arithmetic on the f32 bits. They run on CPU as well, which is how the
tests check them. This package names the device and records why the held form
exists.

Why bf16 values are held in f32 on MPS
--------------------------------------

Where MPS lacks bf16, and what the held-in-f32 form does instead:

- **bf16 tensors at all.** PyTorch allows bf16 tensors on MPS only from macOS 14
  (Sonoma), where MPSGraph added the type; before that, creating or moving one
  raises ``TypeError: MPS BFloat16 is only supported on MacOS 14 or newer``.
  Held form: no bf16 tensor is ever made for a value; a bf16 activation is an
  f32 tensor whose values are bf16 values.
- **bf16 arithmetic.** Apple M1 has no bf16 instructions (ARMv8.6-A BF16 came with M2), and the
  set of MPS kernels with a bf16 variant has grown release by release rather
  than arriving at once, so a bf16 op that works on one macOS/PyTorch pair can
  be missing on another. Held form: every op computes in f32, which MPS has for
  all of them, and the result is rounded on store: the same arithmetic as a
  bf16 kernel that widens, computes and narrows, done explicitly.
- **the rounding cast itself.** The run's bits must not depend on how a
  backend implements ``.to(torch.bfloat16)``, and a
  ``.to(torch.bfloat16).float()`` round trip is not safe under a compiler:
  inductor keeps f32 inside a fused kernel and drops it (measured on CPU with
  PyTorch 2.13: ``torch.compile`` of ``(x.to(bf16).float() * 3.0)`` returns
  other bits than eager). Held form: ``sx.round_to_bf16`` rounds in the int32
  view of the f32 bits (shifts, masks, adds, a select), integer ops that MPS
  supports and that no compiler may drop; it equals torch's nearest-even cast
  on all 2^32 patterns (``python -m benchmarks.rounding``).
- **GEMM with an f32 result from bf16 operands** (``aten::mm.dtype``,
  ``torch.mm(a, b, out_dtype=torch.float32)``) is CUDA-only in PyTorch 2.13.
  Held form: a bf16 matmul is an f32 GEMM of bf16-valued operands rounded on
  store; ``(matmul a b :out :f32)`` is the same GEMM without the rounding, which
  is the f32 accumulator the spec asks for.
- **autocast.** An f32 island is ``with torch.autocast("mps", enabled=False):``,
  so an ambient MPS autocast cannot recast it; the device type is
  ``AUTOCAST_DEVICE_TYPE`` below. ``torch.autocast("mps", enabled=False)`` is
  accepted on a machine without MPS, so a metal module runs on CPU unchanged.

One exception needs a real bf16 tensor on MPS: a frozen parameter stored in bf16
(6.7) is a bf16 buffer, half the memory, widened by an exact ``.float()`` where
it is read. Moving such a module to MPS needs macOS 14 or newer.
"""

from __future__ import annotations

import torch

__all__ = ["AUTOCAST_DEVICE_TYPE", "DEVICE_TYPE", "available"]

DEVICE_TYPE = "mps"
"""The torch device type of the metal target."""

AUTOCAST_DEVICE_TYPE = "mps"
"""The ``device_type`` of ``torch.autocast(..., enabled=False)`` around metal's f32 islands."""


def available() -> bool:
    """True where this PyTorch build has MPS and the machine can use it."""
    return torch.backends.mps.is_built() and torch.backends.mps.is_available()
