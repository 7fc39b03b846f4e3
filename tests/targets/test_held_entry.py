"""A held target's cast at a method's entry (`sx.to_bf16`) leaves a held bf16 value as it is,
as cuda's `.to(torch.bfloat16)` leaves a bf16 tensor: a sub-model called with its caller's
rounded value does not round it again, forward or backward, and computes cuda's bits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import load_module, method_code
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import round_to_bf16, rounding, store_bf16, to_bf16

# Two layers, each a public forward that casts its argument at entry: the first is
# called with the caller's f32 input, the second with the first's held bf16 output.
LAYERS = """
(defmodel lin (&key (n 8))
  (defparam w (normal [n n] :std 0.3))
  (defun forward (x) (linear x w)))
(defparam first (lin))
(defparam second (lin))
(defun forward (x) (second (first x)))
(defrun train :precision :bf16)
"""


def built(target: str):
    code = compile_source(LAYERS, "m.lisp", Options(target=target))
    torch.manual_seed(0)
    module = load_module(code)
    net = getattr(module, module.__all__[0])()
    with torch.no_grad():  # small integers: every sum exact, in any order
        for p in net.parameters():
            p.copy_(torch.randint(-2, 3, p.shape).float())
    return net, code


def roundings_in(module: torch.nn.Module, run, monkeypatch) -> int:
    """The roundings (the runtime's kernel calls) `module`'s forward runs while `run()` runs."""
    inside, counted = [], []

    def counting(x):
        counted.append(bool(inside))
        return kernel(x)

    kernel = rounding._round
    monkeypatch.setattr(rounding, "_round", counting)
    # a hook's result other than None would replace the arguments or the result
    pre = module.register_forward_pre_hook(lambda *_: inside.append(True))
    post = module.register_forward_hook(lambda *_: inside.clear())
    try:
        run()
    finally:
        pre.remove()
        post.remove()
    return sum(counted)


@pytest.mark.parametrize("target", ["cpu", "metal"])
def test_a_sub_model_called_with_a_held_value_does_not_round_it_again(
    target, monkeypatch
):
    net, code = built(target)
    assert "x = sx.to_bf16(x)" in code
    x = torch.randint(-3, 4, (2, 3, 8)).float() + 0.25
    # the first rounds its f32 argument, its weight and its result; the second only its own
    assert roundings_in(net.first, lambda: net(x), monkeypatch) == 3
    assert roundings_in(net.second, lambda: net(x), monkeypatch) == 2


@pytest.mark.parametrize("target", ["cpu", "metal"])
def test_the_entry_cast_keeps_cudas_bits(target):
    held, _ = built(target)
    cuda, code = built("cuda")
    assert "x = x.to(torch.bfloat16)" in code
    x = torch.randint(-3, 4, (2, 3, 8)).float() + 0.25
    results = []
    for net in (held, cuda):
        x_read = x.clone().requires_grad_()
        out = net(x_read)
        out.float().square().sum().backward()
        grads = [x_read.grad] + [p.grad for p in net.parameters()]
        results.append([out.float()] + [g.float() for g in grads])
    for ours, theirs in zip(*results):
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))


def test_an_argument_the_method_returns_is_still_rounded_at_entry():
    """golden/several-values's pooler returns its argument `h`: the gradient of that read
    comes back as the caller sends it (f32 from outside, where cuda's autograd rounds it to
    the output's dtype), so the rounding at entry stays, which rounds it (its gradients are
    cuda's bit for bit in test_target_equivalence)."""
    path = Path(__file__).parents[2] / "golden" / "several-values.lisp"
    code = compile_source(path.read_text(), path.name, Options(target="cpu"))
    pooler = method_code(code.split("class Pooler")[1], "forward")
    assert "h = sx.round_to_bf16(h)" in pooler
    assert "sx.to_bf16" not in code


def test_to_bf16_passes_a_held_value_and_its_views():
    x = torch.randn(4, 6, requires_grad=True)
    rounded = round_to_bf16(x)
    stored = store_bf16(x * 3)
    assert to_bf16(rounded) is rounded
    assert to_bf16(stored) is stored
    view = stored.reshape(6, 4).t()
    assert to_bf16(view) is view


def test_to_bf16_rounds_any_other_value_as_the_cast_does():
    x = torch.randn(4, 6) * 1000
    assert torch.equal(to_bf16(x), x.to(torch.bfloat16).float())
    rounded = round_to_bf16(torch.randn(4, 6))
    with torch.no_grad():
        rounded.mul_(1.1)  # written in place: no longer a bf16 value
    assert to_bf16(rounded) is not rounded
    assert torch.equal(to_bf16(rounded), rounded.to(torch.bfloat16).float())
    with torch.inference_mode():  # no version counter to tell a write by
        inference = round_to_bf16(torch.randn(4, 6))
        assert torch.equal(
            to_bf16(inference * 1.1), (inference * 1.1).bfloat16().float()
        )
