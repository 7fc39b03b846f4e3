"""The held form's backward against native bf16 autograd, bit for bit.

Each function is run twice: on real bf16 tensors (what the cuda target computes on the
CPU) and in the held form, on f32 tensors holding the same bf16 values, with its stores
written `sx.store_bf16` and its f32 reads `sx.as_f32`, as a held target emits them. The
inputs are bf16 values with full bf16 mantissas, so that an unrounded gradient shows.
"""

import pytest
import torch

from benchmarks.step import AGAIN, roundings
from cases import LLAMA, lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import as_f32, round_to_bf16, rounding, store_bf16

BF16 = torch.bfloat16


def native(x):
    return x


CASES = {
    # h read twice by bf16 ops: each read's gradient is rounded before the sum.
    "two reads": lambda h, w, s, f: s(f(h) * f(w)) + s(torch.sigmoid(h)),
    # one read in bf16, one in f32 (an island): the cast's backward rounds.
    "an f32 read": lambda h, w, s, f: s(h * w)
    + round_to_bf16(torch.exp(as_f32(h)) if f is not native else torch.exp(h.float())),
    # backward formulas that read the op's own (rounded) result
    "tanh": lambda h, w, s, f: s(s(torch.tanh(h)) * w),
    "sigmoid": lambda h, w, s, f: s(s(torch.sigmoid(h)) * w),
    "exp": lambda h, w, s, f: s(s(torch.exp(h)) * w),
    # a broadcast operand: each product rounded before the sum to its shape
    "broadcast product": lambda h, w, s, f: s(h * w[:1]),
    # a batched matmul is a view of an mm, whose gradients are rounded
    "batched matmul": lambda h, w, s, f: s(h.reshape(2, 2, 8) @ w.T) + s(h * w).sum(),
}


def held_inputs(generator: torch.Generator):
    """h [4, 8] and w [4, 8] as bf16 values, inside an f32 tensor."""
    return [torch.randn(4, 8, generator=generator).to(BF16).float() for _ in range(2)]


def gradients(fn, held: bool, inputs, upstream):
    leaves = [x.clone().requires_grad_() for x in inputs]
    if held:
        # Stored values: a leaf's gradient reaches it through its store.
        values = [store_bf16(x * 1.0) for x in leaves]
        out = fn(*values, store_bf16, lambda x: x)
    else:
        values = [x.to(BF16) for x in leaves]
        out = fn(*values, native, native)
    out.float().backward(upstream if out.dim() else None)
    return [x.grad for x in leaves]


@pytest.mark.parametrize("name", CASES)
def test_held_gradients_are_native_bf16_gradients(name):
    generator = torch.Generator().manual_seed(0)
    inputs = held_inputs(generator)
    fn = CASES[name]
    with torch.no_grad():
        shape = fn(*[x.to(BF16) for x in inputs], native, native).shape
    upstream = torch.randn(shape, generator=generator).to(BF16).float()
    expected = gradients(fn, False, inputs, upstream)
    actual = gradients(fn, True, inputs, upstream)
    for e, a in zip(expected, actual):
        assert torch.equal(a.view(torch.int32), e.view(torch.int32)), name


def test_a_gemm_gradient_is_never_negative_zero():
    """A bf16 GEMM accumulates from +0; the f32 GEMM of one term returns -0.0."""
    x = torch.zeros(1, 4, requires_grad=True)
    w = torch.ones(4, 16, requires_grad=True)
    upstream = -torch.ones(1, 16)
    assert torch.signbit(x.detach().T @ upstream).any()  # the f32 GEMM's -0.0
    store_bf16(x @ w).backward(upstream)
    assert not torch.signbit(w.grad).any(), w.grad


def test_as_f32_keeps_the_value_and_rounds_the_gradient():
    x = torch.tensor([1.0, 3.0], requires_grad=True)
    y = as_f32(x)
    assert torch.equal(y, x)
    y.backward(torch.tensor([1.0 + 2.0**-9, 0.5]))
    assert x.grad.tolist() == [1.0, 0.5]


def test_store_bf16_adds_no_graph_break():
    def f(x):
        return store_bf16(torch.tanh(x) * 3.0)

    assert torch._dynamo.explain(f)(torch.randn(4)).graph_break_count == 0


def test_a_gradient_a_store_rounded_is_not_rounded_again(monkeypatch):
    """A value with one read gets the gradient that read's store hook rounded: its own
    rounding passes it as it is (the same bits), where a value read twice rounds the sum.
    """
    counted = []
    kernel = rounding._round
    monkeypatch.setattr(
        rounding, "_round", lambda x: counted.append(tuple(x.shape)) or kernel(x)
    )
    x = torch.randn(2, 8, requires_grad=True)
    w = torch.randn(8, 4, requires_grad=True)
    upstream = torch.randn(2, 4)
    once = store_bf16(round_to_bf16(x) @ round_to_bf16(w))
    counted.clear()
    once.backward(upstream)
    # the result's rounding, then the GEMM's hook for x and w; their roundings pass them
    assert counted == [(2, 4), (2, 8), (8, 4)]
    w_bf16 = round_to_bf16(w)
    twice = store_bf16(store_bf16(x @ w_bf16) + store_bf16(x @ w_bf16))
    counted.clear()
    twice.backward(upstream)
    assert counted.count((8, 4)) == 3  # each GEMM's hook, then the sum of the two


def test_a_sum_passes_its_rounded_gradient_on_unrounded(monkeypatch):
    """A residual's sum: its result's rounding rounds the gradient once; the sum sends it
    on to both operands as it is, which neither the sum's hook nor their roundings round
    again (the same bits: a bf16 value)."""
    counted = []
    kernel = rounding._round
    monkeypatch.setattr(
        rounding, "_round", lambda x: counted.append(tuple(x.shape)) or kernel(x)
    )
    x, y = (torch.randn(2, 8, requires_grad=True) for _ in "xy")
    out = store_bf16(round_to_bf16(x) + round_to_bf16(y))
    counted.clear()
    out.backward(torch.randn(2, 8))
    assert counted == [(2, 8)]
    assert torch.equal(x.grad, y.grad)
    assert torch.equal(x.grad, x.grad.to(torch.bfloat16).float())


def test_the_held_llama_step_rounds_nothing_twice():
    """examples/llama.lisp's bf16 run on the cpu target, two layers: every rounding of one
    forward and backward, by why it runs (benchmarks.step's inventory). None rounds a
    value or gradient that is a held bf16 value already; each is one the precision rules
    require. Per layer, forward: 20 stores (7 GEMMs, 2 norms, 3 rotary terms twice, the
    attention, silu and its product, 2 residuals) and 11 casts down (7 weights, 2 norm
    weights, 2 norms' f32 results); around the layers, the final norm's and lm_head's 2
    stores and 6 casts (the embedding's rows, cos, sin, the final norm's weight and
    result, lm_head's weight). Backward: each GEMM's two gradients, each product's (the
    norms' weights' terms and sums, rotary's, the MLP's), the sums of the reads of a value
    read more than once, the f32 islands' reads (the norms', the logits'), attention's q,
    k and v, silu's."""
    path = lisp("llama")
    code = compile_source(
        path.read_text(), path.name, Options(run="train", target="cpu")
    )
    torch.manual_seed(0)
    net = load_module(code).Llama(**LLAMA)
    ids, targets = (torch.randint(0, 256, (2, 16)) for _ in "ab")
    found = roundings(lambda: net.loss(ids, targets).backward())
    assert found == {
        ("forward", "a bf16 op's result (sx.store_bf16)"): 42,
        ("forward", "a cast down (sx.round_to_bf16)"): 28,
        ("backward", "MmBackward0"): 30,
        ("backward", "MulBackward0"): 27,
        ("backward", "_RoundToBf16Backward"): 12,
        ("backward", "_AsF32Backward"): 6,
        ("backward", "ScaledDotProductFlashAttentionForCpuBackward0"): 6,
        ("backward", "SiluBackward0"): 2,
    }
    assert AGAIN not in {why for _, why in found}
