"""Marks for bf16 regions in generated code (LANGUAGE.md 6.5, 8)."""

import contextlib

__all__ = ["bf16_region"]


def bf16_region() -> contextlib.AbstractContextManager[None]:
    """Mark a ``(with-numerics (:precision :bf16) ...)`` block: ``with sx.bf16_region():``.

    A no-op. The compiler fixes every dtype in the region when the file
    compiles and emits the casts explicitly; the block only makes the region
    visible in the generated code. ``contextlib.nullcontext`` is a context
    manager that ``torch.compile`` traces through without a graph break.
    """
    return contextlib.nullcontext()
