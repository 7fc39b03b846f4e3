"""The example models compile, import and train on CPU with the dtypes the policy says.

Each forward is compared with a hand-written reference of the same model with
the same weights. The weights and inputs are small integers, so every GEMM and
sum before the one transcendental step (rms-norm's rsqrt) is exact in f32 in any
order, and the comparisons are bitwise.
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

from bitwise import BF16, F32, assert_same, bits  # noqa: F401 (tests/bitwise.py)
from cases import EXAMPLES


def small(*shape, seed=0, low=-2, high=3):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=generator).float()


def example(build, name: str):
    path = EXAMPLES / f"{name}.lisp"
    module, code = build(path.read_text(encoding="utf-8"), path.name)
    return module, code


def round_trip(net: torch.nn.Module, fresh: torch.nn.Module) -> torch.nn.Module:
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer))
    return fresh


# rms-mlp: bf16 policy, a hand-written rms-norm island, an f32-out head, cross-entropy.


def rms_mlp_reference(x, w1, b1, w2):
    h = torch.relu(x.to(BF16) @ w1.to(BF16) + b1.to(BF16))
    hf = h.float()
    inverse = torch.rsqrt(torch.mean(hf * hf, dim=-1, keepdim=True) + 1e-6)
    normed = h * inverse.to(BF16)
    # :out :f32 on CPU: the f32 GEMM of the bf16 operands (exact here: see below).
    return normed.float() @ w2.to(BF16).float()


def test_rms_mlp_compiles_and_has_the_right_parameters(build):
    module, code = example(build, "rms-mlp")
    assert module.__all__[0] == "RmsMlp"
    net = module.RmsMlp()
    state = net.state_dict()
    assert {k: (tuple(v.shape), v.dtype) for k, v in state.items()} == {
        "w1": ((784, 256), F32),
        "b1": ((256,), F32),
        "w2": ((256, 10), F32),
    }
    assert all(isinstance(p, torch.nn.Parameter) for p in net.parameters())


def test_rms_mlp_forward_matches_hand_written_reference(build):
    module, _ = example(build, "rms-mlp")
    net = module.RmsMlp(d_in=16, d_hidden=8, n_class=4)
    w1, b1, w2 = small(16, 8, seed=1), small(8, seed=2), small(8, 4, seed=3)
    x = small(5, 16, seed=4)
    with torch.no_grad():
        net.w1.copy_(w1)
        net.b1.copy_(b1)
        net.w2.copy_(w2)
    expected = rms_mlp_reference(x, w1, b1, w2)
    # The last GEMM multiplies bf16 values (8 significant bits) by integers in
    # [-2, 2] and sums 8 of them: every partial sum fits f32's 24 bits, so it is
    # exact in any order and the comparison can be bitwise.
    assert_same(net(x), expected)
    labels = torch.tensor([0, 3, 1, 2, 2])
    assert_same(net.loss(x, labels), F.cross_entropy(expected, labels))


def test_rms_mlp_trains_on_cpu(build):
    module, _ = example(build, "rms-mlp")
    torch.manual_seed(0)
    net = module.RmsMlp()
    x = torch.randn(8, 784, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(2))
    logits = net(x)
    assert logits.dtype == F32 and logits.shape == (8, 10)
    loss = net.loss(x, labels)
    assert loss.dtype == F32 and loss.dim() == 0
    loss.backward()
    for name, param in net.named_parameters():
        assert (
            param.dtype == F32 and param.grad is not None and param.grad.dtype == F32
        ), name
        assert torch.isfinite(param.grad).all(), name
    # A step of SGD lowers the loss on this batch.
    with torch.no_grad():
        for param in net.parameters():
            param -= 0.5 * param.grad
    assert net.loss(x, labels) < loss


def test_rms_mlp_state_dict_round_trip_gives_the_same_bits(build):
    module, _ = example(build, "rms-mlp")
    torch.manual_seed(0)
    net = module.RmsMlp()
    torch.manual_seed(1)
    fresh = round_trip(net, module.RmsMlp())
    x = torch.randn(4, 784, generator=torch.Generator().manual_seed(3))
    labels = torch.tensor([1, 2, 3, 4])
    assert_same(fresh(x), net(x))
    assert_same(fresh.loss(x, labels), net.loss(x, labels))


# distill: f32 policy, a frozen teacher read only in a bf16 region.


def test_distill_teacher_is_a_bf16_buffer(build):
    module, _ = example(build, "distill")
    torch.manual_seed(0)
    net = module.Distill()
    torch.manual_seed(0)
    teacher, student = torch.normal(0.0, 1.0, size=(32, 32)), torch.normal(
        0.0, 0.1, size=(32, 32)
    )
    assert dict(net.named_buffers()).keys() == {"teacher"}
    assert dict(net.named_parameters()).keys() == {"student"}
    assert net.teacher.dtype == BF16 and net.student.dtype == F32
    # Made in source order from the default generator, the teacher rounded once.
    assert_same(net.teacher, teacher.to(BF16))
    assert_same(net.student.detach(), student)
    state = net.state_dict()
    assert state["teacher"].dtype == BF16 and state["student"].dtype == F32


def test_distill_forward_and_loss_match_hand_written_reference(build):
    module, _ = example(build, "distill")
    net = module.Distill(d=8)
    teacher, student, x = (
        small(8, 8, seed=1),
        small(8, 8, seed=2),
        small(3, 8, seed=3, low=-16, high=17),
    )
    with torch.no_grad():
        net.teacher.copy_(teacher)
        net.student.copy_(student)
    assert_same(net(x), x @ student)
    target = x.to(BF16) @ teacher.to(BF16)  # the region: bf16 product, rounded on store
    expected = torch.mean(torch.square(x @ student - target.float()))
    assert_same(net.loss(x), expected)


def test_distill_trains_the_student_only(build):
    module, _ = example(build, "distill")
    torch.manual_seed(0)
    net = module.Distill()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    loss = net.loss(x)
    assert loss.dtype == F32
    loss.backward()
    assert net.student.grad is not None and net.student.grad.dtype == F32
    assert not net.teacher.requires_grad and net.teacher.grad is None
    # The gradient of the mean squared error, by hand: 2/N (pred - target) through x @ student.
    target = (x.to(BF16) @ net.teacher).float()
    pred = x @ net.student.detach()
    expected = x.T @ (2.0 * (pred - target) / pred.numel())
    # A tolerance: autograd's backward of mean(square) scales and multiplies in
    # another order than this formula, and the data are not integers here.
    torch.testing.assert_close(net.student.grad, expected, rtol=1e-5, atol=1e-6)


def test_distill_state_dict_round_trip_gives_the_same_bits(build):
    module, _ = example(build, "distill")
    torch.manual_seed(0)
    net = module.Distill()
    torch.manual_seed(1)
    fresh = round_trip(net, module.Distill())
    assert fresh.teacher.dtype == BF16
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(3))
    assert_same(fresh(x), net(x))
    assert_same(fresh.loss(x), net.loss(x))


def test_distill_loading_an_f32_teacher_rounds_it(build):
    module, _ = example(build, "distill")
    net = module.Distill(d=4)
    teacher = torch.randn(4, 4, generator=torch.Generator().manual_seed(5))
    state = {"teacher": teacher, "student": torch.zeros(4, 4)}
    net.load_state_dict(state)
    assert_same(net.teacher, teacher.to(BF16))


@pytest.mark.parametrize("name", ["rms-mlp", "distill"])
def test_example_forward_is_deterministic(build, name):
    module, _ = example(build, name)
    cls = getattr(module, module.__all__[0])
    torch.manual_seed(0)
    net = cls()
    d_in = 784 if name == "rms-mlp" else 32
    x = torch.randn(4, d_in, generator=torch.Generator().manual_seed(1))
    assert_same(net(x), net(x))
