"""round_to_bf16 against torch's own cast, bit for bit.

The algorithm tests run twice: on `round_bits`, the integer form eager code off
the CPU and compiled code off the CPU use, and on `round_to_bf16`, which on the
CPU takes torch's cast (the same bits, in one pass; inlined so when compiled).
"""

import pytest
import torch

from sx2torch.runtime import round_to_bf16
from sx2torch.runtime.rounding import round_bits


@pytest.fixture(
    params=[round_bits, round_to_bf16], ids=["integer form", "round_to_bf16"]
)
def rounding(request):
    return request.param


def from_bits(patterns: list[int]) -> torch.Tensor:
    """float32 tensor whose elements have the given 32-bit patterns (unsigned ints)."""
    signed = [p - (1 << 32) if p >= 1 << 31 else p for p in patterns]
    return torch.tensor(signed, dtype=torch.int32).view(torch.float32)


def bits_of(x: torch.Tensor) -> list[int]:
    return [b & 0xFFFFFFFF for b in x.view(torch.int32).tolist()]


def assert_matches_cast(x: torch.Tensor, ours: torch.Tensor) -> None:
    """Bitwise equal to ``x.to(torch.bfloat16).float()``; two NaNs count as equal."""
    theirs = x.to(torch.bfloat16).float()
    assert ours.dtype == torch.float32 and ours.shape == x.shape
    differ = ours.view(torch.int32) != theirs.view(torch.int32)
    bad = differ & ~(ours.isnan() & theirs.isnan())
    assert (
        not bad.any()
    ), f"mismatch at patterns {[hex(b) for b in bits_of(x[bad][:8])]}"


EDGES = {
    # ties go to the even neighbour, in both directions and both signs
    "1 + 2^-8, tie down": (0x3F808000, 0x3F800000),
    "1 + 3*2^-8, tie up": (0x3F818000, 0x3F820000),
    "-(1 + 2^-8)": (0xBF808000, 0xBF800000),
    "-(1 + 3*2^-8)": (0xBF818000, 0xBF820000),
    "just below the tie": (0x3F807FFF, 0x3F800000),
    "just above the tie": (0x3F808001, 0x3F810000),
    "tie carries into the exponent": (0x3FFF8000, 0x40000000),
    # subnormals
    "smallest subnormal": (0x00000001, 0x00000000),
    "negative smallest subnormal": (0x80000001, 0x80000000),
    "subnormal tie down": (0x00008000, 0x00000000),
    "subnormal tie up": (0x00018000, 0x00020000),
    "largest subnormal rounds to the smallest normal": (0x007FFFFF, 0x00800000),
    "bf16 subnormal kept": (0x00010000, 0x00010000),
    # the top of the range
    "largest bf16": (0x7F7F0000, 0x7F7F0000),
    "just below halfway to inf": (0x7F7F7FFF, 0x7F7F0000),
    "halfway to inf": (0x7F7F8000, 0x7F800000),
    "largest f32": (0x7F7FFFFF, 0x7F800000),
    "negative largest f32": (0xFF7FFFFF, 0xFF800000),
    "negative halfway to inf": (0xFF7F8000, 0xFF800000),
    # zeros and infinities
    "+0": (0x00000000, 0x00000000),
    "-0": (0x80000000, 0x80000000),
    "+inf": (0x7F800000, 0x7F800000),
    "-inf": (0xFF800000, 0xFF800000),
}

NANS = [
    0x7FFFFFFF,
    0xFFFFFFFF,
    0x7F800001,
    0xFF800001,
    0x7F808000,
    0x7FC00000,
    0xFFC00000,
    0x7FFF8000,
    0x7FBFFFFF,
]


@pytest.mark.parametrize("pattern, expected", EDGES.values(), ids=EDGES.keys())
def test_edge_values(pattern: int, expected: int, rounding) -> None:
    x = from_bits([pattern])
    ours = rounding(x)
    assert bits_of(ours) == [expected]
    assert_matches_cast(x, ours)


@pytest.mark.parametrize("pattern", NANS, ids=hex)
def test_nan_stays_nan(pattern: int, rounding) -> None:
    x = from_bits([pattern])
    assert x.isnan().all()
    assert rounding(x).isnan().all()


def test_every_bf16_value_and_its_rounding_boundaries(rounding) -> None:
    """Every high half (sign, exponent, 7 mantissa bits) with the low halves that matter."""
    high = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32) << 16
    low = torch.tensor([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int32)
    x = (high[:, None] | low[None, :]).view(torch.float32)
    assert_matches_cast(x, rounding(x))


def test_ten_million_random_patterns(rounding) -> None:
    generator = torch.Generator().manual_seed(20240601)
    for _ in range(10):
        wide = torch.randint(-(1 << 31), 1 << 31, (10**6,), generator=generator)
        x = wide.to(torch.int32).view(torch.float32)
        assert_matches_cast(x, rounding(x))


def test_keeps_shape_of_a_non_contiguous_tensor(rounding) -> None:
    x = torch.randn(5, 7).t()
    ours = rounding(x)
    assert ours.shape == (7, 5)
    assert_matches_cast(x, ours)


def test_gradient_is_rounded_as_the_value_is() -> None:
    """A gradient flowing into a bf16 value is a bf16 value, as on the cuda target."""
    x = from_bits([0x3F808000, 0x7F7FFFFF, 0x00000001, 0x7FFFFFFF]).requires_grad_()
    upstream = from_bits([p for p, _ in EDGES.values()][:4])
    round_to_bf16(x).backward(upstream)
    assert_matches_cast(upstream, x.grad)
    assert bits_of(x.grad) == [e for _, e in list(EDGES.values())[:4]]


def test_double_backward_rounds_too() -> None:
    """The backward is the same rounding, so a gradient of a gradient rounds."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    g = torch.tensor([1.0 + 2.0**-9, 3.0], requires_grad=True)
    (grad,) = torch.autograd.grad(round_to_bf16(x), x, g, create_graph=True)
    assert grad.tolist() == [1.0, 3.0]
    (grad_g,) = torch.autograd.grad(grad, g, torch.tensor([1.0 + 2.0**-9, 0.5]))
    assert grad_g.tolist() == [1.0, 0.5]


def test_rejects_a_tensor_that_is_neither_float32_nor_bfloat16() -> None:
    with pytest.raises(TypeError, match="float32"):
        round_to_bf16(torch.ones(3, dtype=torch.float16))


def test_widens_a_bfloat16_tensor_exactly() -> None:
    x = torch.tensor([1.0, -2.5, 3.0078125, float("inf")], dtype=torch.bfloat16)
    widened = round_to_bf16(x)
    assert widened.dtype == torch.float32
    assert torch.equal(widened, x.float())


def test_torch_compile_without_graph_breaks_still_rounds_when_fused() -> None:
    """Inductor fuses the rounding with its neighbours and keeps it: unlike a
    plain ``.to(torch.bfloat16).float()`` round trip, which it may elide."""

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return round_to_bf16(x * 0.75) * 2.0

    generator = torch.Generator().manual_seed(7)
    wide = torch.randint(-(1 << 31), 1 << 31, (1 << 16,), generator=generator)
    edges = [p for p, _ in EDGES.values()] + NANS
    x = torch.cat([wide.to(torch.int32).view(torch.float32), from_bits(edges)])
    # fullgraph: a graph break is an error
    assert_matches_cast(x, torch.compile(round_to_bf16, fullgraph=True)(x))
    compiled, eager = torch.compile(scaled, fullgraph=True)(x), scaled(x)
    assert torch.equal(compiled.isnan(), eager.isnan())
    assert torch.equal(compiled.nan_to_num(), eager.nan_to_num())

    # The compiled backward rounds too: grad = 0.75 * bf16(2 * upstream).
    finite = x.nan_to_num(0.0, 0.0, 0.0).clamp(-1e30, 1e30)
    upstream = torch.randn(x.shape, generator=generator)
    leaf = finite.clone().requires_grad_()
    torch.compile(scaled, fullgraph=True)(leaf).backward(upstream)
    expected = 0.75 * (2.0 * upstream).to(torch.bfloat16).float()
    assert torch.equal(leaf.grad, expected)
