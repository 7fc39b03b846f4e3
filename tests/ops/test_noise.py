"""Dropout and random values (issue 20, item 10): drawn from torch's default generator, so a
seed fixes them; dropout only in training mode; the same draws on every target; compiled
whole by torch.compile; how `gradient` treats them; the interpreter draws as the module does.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from cases import lisp
from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

SOURCE = lisp("dropout").read_text()
BF16 = torch.bfloat16


def vae(model, x):
    """The golden case's forward in plain PyTorch, as its bf16 run computes it."""
    h = F.dropout(x.to(BF16) @ model.enc.to(BF16), 0.1, training=model.training)
    mu, logvar = h[:, :4], h[:, 4:]
    std = torch.exp(0.5 * logvar.float())
    return mu + (std * torch.randn_like(mu, dtype=torch.float32)).to(BF16)


def seeded(fn, *args, seed=3):
    torch.manual_seed(seed)
    return fn(*args)


@pytest.mark.parametrize("training", [True, False])
def test_dropout_and_noise_against_plain_pytorch(build, training):
    module, _ = build(SOURCE, "dropout.lisp")
    model = module.Dropout().train(training)
    x = torch.randn(64, 4)
    got = seeded(model, x)
    assert got.dtype == BF16 and torch.equal(got, seeded(vae, model, x))
    assert not torch.equal(got, seeded(model, x, seed=4))  # the noise is drawn
    jitter = seeded(model.jitter, x)
    assert torch.equal(jitter, x + 0.01 * seeded(torch.rand, 64, 4))


def test_eval_mode_is_the_identity_and_draws_nothing(build):
    module, _ = build("(defun forward (x) (dropout x 0.5))")
    model, x = module.Model().eval(), torch.randn(8, 8)
    state = torch.get_rng_state()
    assert torch.equal(model(x), x) and torch.equal(torch.get_rng_state(), state)


def test_every_target_draws_the_same_numbers(build):
    """Same seed, same device, same bits: in f32 everywhere; in bf16 the draws and the
    dropped elements are the same, and a held target's dropout scales in f32 and rounds once
    (as on a GPU), where torch's CPU kernel on a bf16 tensor rounds the scale first."""
    x = torch.randn(64, 4)
    f32 = SOURCE.replace(":precision :bf16", ":precision :f32")
    outputs = {}
    for target in ("cuda", "metal", "cpu"):
        for run, source in (("f32", f32), ("bf16", SOURCE)):
            module, _ = build(source, "dropout.lisp", target=target)
            torch.manual_seed(0)
            model = module.Dropout()
            outputs[target, run] = seeded(model, x), seeded(model.jitter, x)
    for target in ("metal", "cpu"):
        for a, b in zip(outputs["cuda", "f32"], outputs[target, "f32"]):
            assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
        held, native = outputs[target, "bf16"][0], outputs["cuda", "bf16"][0]
        assert torch.equal(held, outputs["cpu", "bf16"][0])
        assert torch.equal(held == 0, native.float() == 0)
    torch.manual_seed(0)
    model = module.Dropout()  # the cpu module of the bf16 run
    h = (x.to(BF16) @ model.enc.to(BF16)).float()

    def held():
        once = F.dropout(h, 0.1).to(BF16)  # f32 product, rounded once
        std = torch.exp(0.5 * once[:, 4:].float())
        noise = (std * torch.randn(64, 4)).to(BF16)
        return (once[:, :4].float() + noise.float()).to(BF16)

    assert torch.equal(seeded(model, x), seeded(held).float())


def test_torch_compile_takes_the_whole_forward_and_draws_as_eager(build):
    module, _ = build(SOURCE, "dropout.lisp")
    model, x = module.Dropout(), torch.randn(64, 4)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    assert torch.equal(seeded(compiled, x), seeded(model, x))
    model.eval()  # the training flag is a guard: eval mode recompiles, still whole
    assert torch.equal(seeded(compiled, x), seeded(model, x))
    torch._dynamo.reset()


def test_gradient_through_a_draw_is_zero_and_through_dropout_a_diagnostic(build):
    module, _ = build("(defun forward (x) (gradient (sum (* x (randn-like x))) x))")
    x = torch.randn(5, 3)
    assert torch.equal(seeded(module.Model(), x), seeded(torch.randn, 5, 3))
    with pytest.raises(SourceError) as raised:
        compile_source(
            "(defun forward (x)\n  (gradient (sum (dropout x 0.5)) x))",
            "m.lisp",
            Options(),
        )
    assert (raised.value.span.line, raised.value.span.col) == (2, 18)
    assert "'dropout' has no gradient (F.dropout keeps no mask" in raised.value.message


def test_a_draw_in_a_differentiated_loop_is_a_diagnostic():
    source = (
        "(defmodel blk ()\n  (defparam w (normal [4]))\n"
        "  (defun forward (h) (* h (* w (randn-like w)))))\n"
        "(defparam blocks (stack 2 (blk)))\n"
        "(defun forward (x) (gradient (sum (chain blocks x)) x))"
    )
    with pytest.raises(SourceError) as raised:
        compile_source(source, "m.lisp", Options())
    assert (raised.value.span.line, raised.value.span.col) == (3, 32)
    assert "would compute the layer's forward again and draw anew" in (
        raised.value.message
    )


def test_loss_backward_differentiates_dropout_with_its_mask(build):
    module, _ = build(
        "(defparam w (ones [6]))\n(defun forward (x) (dropout (* x w) 0.5))"
    )
    model, x = module.Model(), torch.randn(6)
    seeded(model, x).sum().backward()
    keep = seeded(F.dropout, torch.ones(6), 0.5)
    assert torch.equal(model.w.grad, x * keep)


@pytest.mark.parametrize("training", [True, False])
def test_the_interpreter_draws_as_the_module_does(build, training):
    module, _ = build(SOURCE, "dropout.lisp")
    model = module.Dropout().train(training)
    oracle = interpret.load(SOURCE, "dropout.lisp", state=model.state_dict())
    if not training:
        oracle.eval()
    x = torch.randn(64, 4)
    for method in ("forward", "jitter"):
        got = seeded(oracle, method, x)
        assert torch.equal(got, seeded(getattr(model, method), x)), method
