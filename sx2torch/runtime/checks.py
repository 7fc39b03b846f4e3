"""Checks the compiler could not make: a fact about a shape known only when the module runs."""

from __future__ import annotations

import torch


def expect_scalar(value: torch.Tensor, form: str) -> torch.Tensor:
    """`value` itself, once it is known to be 0-d: `(gradient Y X)` needs a scalar Y, and the
    rank of `form` (Y's source) depended on arguments the compiler could not see."""
    if value.dim() != 0:
        raise ValueError(
            f"{form}: gradient needs a scalar Y, got a tensor of shape {list(value.shape)}; "
            "reduce it over all axes, as (sum ...) or (mean ...)"
        )
    return value
