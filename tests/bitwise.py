"""Bitwise comparison of tensors, shared by the numeric tests."""

import torch

BF16, F32 = torch.bfloat16, torch.float32


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns, so that equality is exact (and NaN equals the same NaN)."""
    view = {BF16: torch.int16, F32: torch.int32}.get(t.dtype)
    t = t.detach().contiguous()
    return t.view(view) if view is not None else t


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bitwise equality, dtype and shape included."""
    assert (
        actual.dtype == expected.dtype
    ), f"dtype {actual.dtype}, expected {expected.dtype}"
    assert (
        actual.shape == expected.shape
    ), f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    assert torch.equal(
        bits(actual), bits(expected)
    ), f"values differ:\n{actual}\nexpected\n{expected}"
