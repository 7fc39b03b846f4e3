"""matmul_f32_out against plain PyTorch: values, dtypes, gradients, compile."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from sx2torch.runtime import matmul_f32_out

SHAPES = {
    "2-D": ((3, 4), (4, 5)),
    "1-D @ 2-D": ((4,), (4, 5)),
    "2-D @ 1-D": ((3, 4), (4,)),
    "1-D @ 1-D": ((4,), (4,)),
    "3-D @ 2-D": ((2, 3, 4), (4, 5)),
    "3-D @ 1-D": ((2, 3, 4), (4,)),
    "1-D @ 3-D": ((4,), (2, 4, 5)),
    "2-D @ 3-D": ((3, 4), (2, 4, 5)),
    "4-D @ 3-D, broadcasting": ((2, 1, 3, 4), (5, 4, 6)),
    "empty rows": ((0, 4), (4, 5)),
    "empty reduction": ((2, 3, 0), (1, 0, 5)),
}


def small_ints(shape: tuple[int, ...], seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    """Integers in [-2, 2]: every product, sum and gradient here is exact in bf16."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=generator).to(dtype)


def leaves(shape_a, shape_b, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    a = small_ints(shape_a, seed).requires_grad_()
    b = small_ints(shape_b, seed + 1).requires_grad_()
    return a, b


@pytest.mark.parametrize("shape_a, shape_b", SHAPES.values(), ids=SHAPES.keys())
def test_forward_is_the_f32_product_of_the_bf16_operands(shape_a, shape_b) -> None:
    a, b = leaves(shape_a, shape_b)
    out = matmul_f32_out(a, b)
    expected = torch.matmul(a.detach().float(), b.detach().float())
    assert out.dtype == torch.float32
    assert out.shape == expected.shape
    assert torch.equal(out, expected)


@pytest.mark.parametrize("shape_a, shape_b", SHAPES.values(), ids=SHAPES.keys())
def test_gradients_are_bf16_gemms_of_the_rounded_gradient(shape_a, shape_b) -> None:
    a, b = leaves(shape_a, shape_b)
    out = matmul_f32_out(a, b)
    upstream = small_ints(out.shape, seed=9, dtype=torch.float32)
    grad_a, grad_b = torch.autograd.grad(out, (a, b), upstream)

    # reference: PyTorch's own bf16 matmul, fed the gradient rounded to bf16
    ref_a, ref_b = a.detach().requires_grad_(), b.detach().requires_grad_()
    ref_out = torch.matmul(ref_a, ref_b)
    expected_a, expected_b = torch.autograd.grad(
        ref_out, (ref_a, ref_b), upstream.to(torch.bfloat16)
    )
    assert grad_a.dtype == grad_b.dtype == torch.bfloat16
    assert grad_a.shape == a.shape and grad_b.shape == b.shape
    assert torch.equal(grad_a, expected_a)
    assert torch.equal(grad_b, expected_b)


def test_2d_gradients_with_non_integer_values() -> None:
    generator = torch.Generator().manual_seed(3)
    a = torch.randn(6, 8, generator=generator).bfloat16().requires_grad_()
    b = torch.randn(8, 5, generator=generator).bfloat16().requires_grad_()
    upstream = torch.randn(6, 5, generator=generator)
    grad_a, grad_b = torch.autograd.grad(matmul_f32_out(a, b), (a, b), upstream)
    rounded = upstream.to(torch.bfloat16)
    assert torch.equal(grad_a, rounded @ b.detach().t())
    assert torch.equal(grad_b, a.detach().t() @ rounded)


def test_forward_keeps_the_f32_accumulator() -> None:
    """1 + 2^-9 is not a bf16 value: a bf16 store would round it to 1."""
    a = torch.tensor([[1.0, 2.0**-9]], dtype=torch.bfloat16)
    b = torch.tensor([[1.0], [1.0]], dtype=torch.bfloat16)
    assert matmul_f32_out(a, b).item() == 1.0 + 2.0**-9
    assert torch.matmul(a, b).item() == 1.0


def test_finite_differences_match_the_gradient() -> None:
    """The product is bilinear: moving one entry of an operand by 1 moves
    sum(out * g) by exactly that entry of the gradient (all values integers)."""
    a, b = leaves((2, 3, 4), (4, 5), seed=4)
    upstream = small_ints((2, 3, 5), seed=5, dtype=torch.float32)

    def loss(x: torch.Tensor, y: torch.Tensor) -> float:
        return float((matmul_f32_out(x, y) * upstream).sum())

    grad_a, grad_b = torch.autograd.grad(matmul_f32_out(a, b), (a, b), upstream)
    base = loss(a.detach(), b.detach())
    for operand, grad, moved in ((a, grad_a, 0), (b, grad_b, 1)):
        for index in range(operand.numel()):
            bumped = operand.detach().clone()
            bumped.view(-1)[index] += 1
            args = [a.detach(), b.detach()]
            args[moved] = bumped
            assert loss(*args) - base == grad.view(-1)[index].item()


def test_f32_operand_is_cast_down_and_gets_an_f32_gradient() -> None:
    generator = torch.Generator().manual_seed(1)
    a = torch.randn(3, 4, generator=generator, requires_grad=True)
    b = torch.randn(4, 5, generator=generator).bfloat16().requires_grad_()
    out = matmul_f32_out(a, b)
    assert torch.equal(out, matmul_f32_out(a.detach().bfloat16(), b.detach()))
    out.sum().backward()
    assert a.grad.dtype == torch.float32 and b.grad.dtype == torch.bfloat16


def test_ambient_autocast_does_not_change_the_result() -> None:
    a, b = leaves((2, 3, 4), (2, 4, 5))
    expected = matmul_f32_out(a, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = matmul_f32_out(a, b)
    assert out.dtype == torch.float32
    assert torch.equal(out, expected)


def test_rejects_integer_and_scalar_operands() -> None:
    with pytest.raises(TypeError):
        matmul_f32_out(torch.ones(2, 2, dtype=torch.int64), torch.ones(2, 2))
    with pytest.raises(ValueError):
        matmul_f32_out(torch.tensor(1.0), torch.ones(2))


def test_cuda_path_has_an_f32_result() -> None:
    """Fake CUDA tensors (no GPU needed) take the ``out_dtype`` branch: shapes and dtype."""
    with FakeTensorMode():
        for shape_a, shape_b in SHAPES.values():
            a = torch.empty(shape_a, dtype=torch.bfloat16, device="cuda")
            b = torch.empty(shape_b, dtype=torch.bfloat16, device="cuda")
            out = matmul_f32_out(a, b)
            assert out.dtype == torch.float32 and out.device.type == "cuda"
            assert out.shape == torch.matmul(a, b).shape


def test_meta_tensors_give_shapes_and_dtype() -> None:
    a = torch.empty(2, 3, 4, dtype=torch.bfloat16, device="meta")
    b = torch.empty(4, 5, dtype=torch.bfloat16, device="meta")
    out = matmul_f32_out(a, b)
    assert out.shape == (2, 3, 5) and out.dtype == torch.float32


def test_torch_compile_without_graph_breaks_forward_and_backward() -> None:
    def model(x, w, v):
        return (matmul_f32_out(x, w).relu() @ v).sum()

    x, w = leaves((2, 3, 4), (4, 5))
    v = small_ints((5, 2), seed=2, dtype=torch.float32)
    # fullgraph: a graph break is an error, so this is the one graph
    compiled_loss = torch.compile(model, fullgraph=True)(x, w, v)
    compiled_grads = torch.autograd.grad(compiled_loss, (x, w))
    eager_loss = model(x, w, v)
    eager_grads = torch.autograd.grad(eager_loss, (x, w))
    assert torch.equal(compiled_loss, eager_loss)
    for compiled, eager in zip(compiled_grads, eager_grads):
        assert compiled.dtype == torch.bfloat16
        assert torch.equal(compiled, eager)


@st.composite
def broadcastable_shapes(draw) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Operand shapes torch.matmul accepts: vectors, matrices, broadcast batches."""
    n, k, m = (draw(st.integers(1, 4)) for _ in range(3))
    batch = draw(st.lists(st.integers(1, 3), max_size=3))
    batch_a = [d if draw(st.booleans()) else 1 for d in batch]
    batch_b = [d if draw(st.booleans()) else 1 for d in batch]
    batch_a = batch_a[draw(st.integers(0, len(batch_a))) :]
    batch_b = batch_b[draw(st.integers(0, len(batch_b))) :]
    shape_a = (k,) if draw(st.booleans()) else (*batch_a, n, k)
    shape_b = (k,) if draw(st.booleans()) else (*batch_b, k, m)
    return shape_a, shape_b


@settings(max_examples=60, deadline=None)
@given(broadcastable_shapes())
def test_any_matmul_shape(shapes) -> None:
    a, b = leaves(*shapes)
    out = matmul_f32_out(a, b)
    assert torch.equal(out, torch.matmul(a.detach().float(), b.detach().float()))
    grad_a, grad_b = torch.autograd.grad(out, (a, b), torch.ones_like(out))
    assert grad_a.shape == a.shape and grad_b.shape == b.shape
    assert grad_a.dtype == grad_b.dtype == torch.bfloat16


# --- held=True: the metal and cpu targets, bf16 values held in f32 ----------


def rounded(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


@pytest.mark.parametrize("shape_a, shape_b", SHAPES.values(), ids=SHAPES.keys())
def test_held_form_gives_the_bf16_forms_values_and_gradients(shape_a, shape_b) -> None:
    """The upstream gradient is not bf16 (integers times 1 + 2^-9): both forms round
    it to the integers, so every product and sum after is exact and equal."""
    a, b = leaves(shape_a, shape_b)
    held_a, held_b = a.detach().float().requires_grad_(), b.detach().float()
    held_b.requires_grad_()
    out = matmul_f32_out(a, b)
    held_out = matmul_f32_out(held_a, held_b, held=True)
    assert held_out.dtype == torch.float32 and torch.equal(held_out, out)
    upstream = small_ints(out.shape, seed=9, dtype=torch.float32) * (1 + 2.0**-9)
    grads = torch.autograd.grad(out, (a, b), upstream)
    held_grads = torch.autograd.grad(held_out, (held_a, held_b), upstream)
    for grad, held_grad in zip(grads, held_grads):
        assert held_grad.dtype == torch.float32
        assert torch.equal(held_grad, grad.float())


def test_held_gradients_are_rounded_on_store() -> None:
    generator = torch.Generator().manual_seed(3)
    a = rounded(torch.randn(6, 8, generator=generator)).requires_grad_()
    b = rounded(torch.randn(8, 5, generator=generator)).requires_grad_()
    upstream = torch.randn(6, 5, generator=generator)
    out = matmul_f32_out(a, b, held=True)
    assert torch.equal(out, a.detach() @ b.detach())
    grad_a, grad_b = torch.autograd.grad(out, (a, b), upstream)
    assert torch.equal(grad_a, rounded(rounded(upstream) @ b.detach().t()))
    assert torch.equal(grad_b, rounded(a.detach().t() @ rounded(upstream)))


def test_held_form_takes_float32_only() -> None:
    with pytest.raises(TypeError, match="held=True"):
        matmul_f32_out(torch.ones(2, 2, dtype=torch.bfloat16), torch.ones(2, 2), True)


def test_held_form_under_torch_compile_without_graph_breaks() -> None:
    def model(x, w, v):
        return (matmul_f32_out(x, w, held=True).relu() @ v).sum()

    x = rounded(torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(4)))
    w = rounded(torch.randn(4, 5, generator=torch.Generator().manual_seed(5)))
    v = torch.randn(5, 2, generator=torch.Generator().manual_seed(6))
    x.requires_grad_(), w.requires_grad_()
    # fullgraph: a graph break is an error, so this is the one graph
    compiled = torch.autograd.grad(
        torch.compile(model, fullgraph=True)(x, w, v), (x, w)
    )
    eager = torch.autograd.grad(model(x, w, v), (x, w))
    for c, e in zip(compiled, eager):
        assert torch.equal(c, rounded(c)), "the compiled backward rounds on store"
        assert torch.equal(c, e)
