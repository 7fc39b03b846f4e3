"""Sizes the compiler could not check: those computed from constructor arguments."""

from __future__ import annotations

from sx2torch.limits import MAX_LAYERS


def layers(count: int) -> range:
    """`range(count)` for the layers of a stack, once `count` is within the limit: a stack
    of 10**11 small layers would take memory layer by layer until the process is killed.
    """
    if count > MAX_LAYERS:
        raise ValueError(f"a stack has at most {MAX_LAYERS:,} layers, got {count:,}")
    return range(count)
