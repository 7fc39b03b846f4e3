"""`@sx.saves_bf16`: what autograd saves of a held target's bf16 values is their bf16
tensors, 2 bytes a value, restored bit for bit; any other value as it is.

The peaks of memory are counted by benchmarks.step's own counter (`PeakMemory`: the bytes
of the tensors the step makes, alive at once), not timed.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.timing import PeakMemory
from cases import LLAMA, lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import round_to_bf16, saves_bf16, store_bf16
from sx2torch.runtime import rounding
from sx2torch.runtime.rounding import _Bf16, _pack, _unpack


def every_bf16_value() -> torch.Tensor:
    """The 2^16 bf16 bit patterns as f32 (NaNs with every payload and sign, -0.0, the
    infinities, the subnormals), shaped [256, 256]."""
    high = torch.arange(-(2**15), 2**15, dtype=torch.int32) << 16
    return high.view(torch.float32).reshape(256, 256)


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


@pytest.mark.parametrize(
    "grad", [True, False], ids=["the cast's own", "made at the save"]
)
@pytest.mark.parametrize("layout", ["contiguous", "strided", "transposed"])
def test_a_held_value_comes_back_with_its_bits(layout, grad):
    """Every bf16 pattern, rounded from a contiguous tensor and from a strided one (on the
    CPU torch's cast writes a NaN differently in its scalar and vectorized loops), then
    saved whole and as views: unpacked, each has the held value's bits. Its bf16 tensor is
    the rounding's own where grad was on, else made from its bits when first saved."""
    values = every_bf16_value()
    if layout == "strided":
        values = torch.stack([values, values], dim=-1)[..., 0]
    elif layout == "transposed":
        values = values.t()
    with torch.set_grad_enabled(grad):
        held = round_to_bf16(values)
    for saved in (held, held.t(), held[3::5, 1:200:3], held[7:]):
        packed = _pack(saved)
        assert isinstance(packed, _Bf16) and packed.low.dtype == torch.bfloat16
        unpacked = _unpack(packed)
        assert unpacked.dtype == torch.float32 and unpacked.shape == saved.shape
        assert torch.equal(bits(unpacked), bits(saved))


def test_only_a_rounding_result_is_packed():
    """Never guessed from the data: an f32 tensor holding bf16 values that no rounding made
    (an f32 island's value) is saved as it is, as is a held value written in place since.
    """
    island = torch.randn(4, 8).to(torch.bfloat16).float()
    assert _pack(island) is island
    held = round_to_bf16(torch.randn(4, 8))
    with torch.no_grad():
        held.mul_(2.0)  # exact, but a write: no longer known to be a rounding's result
    assert _pack(held) is held
    assert isinstance(_pack(round_to_bf16(torch.randn(4, 8))), _Bf16)


def test_a_held_values_entry_goes_with_it():
    """The runtime's record of the held values (a dict by id, weakly referring to each)
    holds nothing of a value once it is gone, and is not fooled by a view or a write."""
    before = len(rounding._ROUNDED)
    values = [round_to_bf16(torch.randn(3, 4)) for _ in range(50)]
    assert len(rounding._ROUNDED) == before + 50
    assert all(isinstance(_pack(v.t()), _Bf16) for v in values)
    del values
    assert len(rounding._ROUNDED) == before


def test_a_rounded_weight_is_saved_once_in_two_bytes():
    """A rounded weight read by two GEMMs is one bf16 tensor after the forward: the f32
    rounding is freed, and neither reader keeps a copy of its own."""
    weight = torch.randn(64, 64, requires_grad=True)
    inputs = [torch.randn(8, 64, requires_grad=True) for _ in range(2)]

    @saves_bf16
    def loss(a, b):
        w = round_to_bf16(weight)
        return torch.sum(store_bf16(a @ w) + store_bf16(b @ w))

    with PeakMemory() as memory:
        out = loss(*inputs)
        after_forward = memory.now
        out.backward()
    assert after_forward == out.nbytes + weight.numel() * 2


def test_the_callers_own_hooks_see_every_value():
    """Under hooks of the caller's own (torch.utils.checkpoint, save_on_cpu), a held method
    leaves them be: they are given its f32 tensors."""
    seen = []

    @saves_bf16
    def forward(x, w):
        return store_bf16(round_to_bf16(x) @ round_to_bf16(w))

    def pack(x):
        seen.append(x.dtype)
        return x

    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        forward(x, w).sum().backward()
    assert seen and set(seen) == {torch.float32}


def llama(run: str, target: str):
    path = lisp("llama")
    code = compile_source(path.read_text(), path.name, Options(run=run, target=target))
    torch.manual_seed(0)
    return load_module(code).Llama(**LLAMA)


def peak_and_gradients(net, ids, targets, hooks=True) -> tuple:
    net.zero_grad(set_to_none=True)
    with PeakMemory() as memory:
        if hooks:
            loss = net.loss(ids, targets)
        else:
            with torch.autograd.graph.disable_saved_tensors_hooks("off for the test"):
                loss = net.loss(ids, targets)
        loss.backward()
    return memory.peak, [loss.detach()] + [p.grad for p in net.parameters()]


def test_the_held_llama_peaks_below_its_f32_run_with_the_same_bits():
    """examples/llama.lisp's bf16 run on the cpu target: its forward and backward peak
    below the f32 run's (they were 1.07x it, autograd holding each held bf16 value in 4
    bytes), and its loss and gradients have the bits they have with nothing packed."""
    generator = torch.Generator().manual_seed(1)
    ids, targets = (torch.randint(0, 256, (2, 64), generator=generator) for _ in "ab")
    held = llama("train", "cpu")
    f32_peak, _ = peak_and_gradients(llama("exact", "cpu"), ids, targets)
    held_peak, packed = peak_and_gradients(held, ids, targets)
    assert held_peak < 0.8 * f32_peak, (held_peak, f32_peak)
    _, unpacked = peak_and_gradients(held, ids, targets, hooks=False)
    for ours, theirs in zip(packed, unpacked):
        assert torch.equal(bits(ours), bits(theirs))
