"""The standard-library examples end to end: tiny-gpt.lisp and scan.lisp compile,
import, train, round-trip their state_dict, compile with torch.compile(fullgraph=True)
without graph breaks and export with torch.export."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest
import torch

from sx2torch.compiler import compile_source

from cases import EXAMPLES

SMALL_GPT = {
    "vocab": 128,
    "d": 64,
}  # the file's defaults are 512 and 128: smaller keeps CPU tests fast


@pytest.fixture
def load(tmp_path, request):
    """load(example, precision=None) -> the generated module, imported from a file.

    torch.compile and torch.export look generated functions' globals up through
    sys.modules, so the module is imported for real (and removed afterwards).
    `precision` rewrites the example's defrun in this test's copy of the source.
    """
    names = []

    def compile_and_import(example: str, precision: str | None = None):
        text = (EXAMPLES / example).read_text()
        if precision is not None:
            assert ":precision :bf16" in text
            text = text.replace(":precision :bf16", f":precision :{precision}")
        code = compile_source(text, example)
        name = f"sx_{request.node.name}_{len(names)}".translate(
            str.maketrans("[]-.", "____")
        )
        path = tmp_path / f"{name}.py"
        path.write_text(code)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        names.append(name)
        spec.loader.exec_module(module)
        return module

    yield compile_and_import
    for name in names:
        sys.modules.pop(name, None)


def gpt_batch(vocab: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (4, 32), generator=generator)
    return idx, torch.randint(0, vocab, (4, 32), generator=generator)


def scan_batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(4, 24, 64, generator=generator), torch.randn(
        4, 24, 64, generator=generator
    )


def train(loss_of, model, steps: int = 40, lr: float = 1e-2) -> tuple[float, float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_of()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses[0], loss_of().item()


def scan_loss(model, x, y):
    return (model(x).float() - y).square().mean()


def perturb(model, seed: int = 1) -> None:
    """Give the zero-initialized projections values, so outputs depend on every parameter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.02)


@pytest.mark.parametrize("precision", ["bf16", "f32"])
def test_tiny_gpt_overfits_a_fixed_batch(load, precision):
    module = load("tiny-gpt.lisp", None if precision == "bf16" else precision)
    torch.manual_seed(0)
    model = module.TinyGpt(**SMALL_GPT)
    idx, targets = gpt_batch(SMALL_GPT["vocab"])
    logits = model(idx)
    assert logits.dtype == torch.float32 and logits.shape == (4, 32, SMALL_GPT["vocab"])
    assert all(
        p.dtype == torch.float32 for p in model.parameters()
    )  # f32 master weights
    first, last = train(lambda: model.loss(idx, targets), model)
    assert last <= 0.6 * first, (first, last)


def test_tiny_gpt_runs_attention_in_bf16_with_an_f32_softmax(load):
    module = load("tiny-gpt.lisp")
    source = Path(module.__file__).read_text()
    assert "weights = torch.softmax(sx.causal_mask(scores.float()), dim=-1)" in source
    assert "return weights.to(torch.bfloat16) @ v" in source


@pytest.mark.parametrize("precision", ["bf16", "f32"])
def test_scan_trains(load, precision):
    module = load("scan.lisp", None if precision == "bf16" else precision)
    torch.manual_seed(0)
    model = module.Scan()
    x, y = scan_batch()
    assert "sx.linear_scan(" in Path(module.__file__).read_text()
    first, last = train(lambda: scan_loss(model, x, y), model, steps=30)
    assert last <= 0.9 * first, (first, last)
    loss = scan_loss(model, x, y)
    loss.backward()
    assert all(
        p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters()
    )


def fresh_copy(model_class, model, **kwargs):
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    torch.manual_seed(12345)  # a different initialization, overwritten by the load
    fresh = model_class(**kwargs)
    fresh.load_state_dict(torch.load(buffer))
    return fresh


def test_state_dict_round_trips_bitwise(load):
    gpt = load("tiny-gpt.lisp")
    model = gpt.TinyGpt(**SMALL_GPT)
    perturb(model)
    idx, _ = gpt_batch(SMALL_GPT["vocab"])
    assert torch.equal(fresh_copy(gpt.TinyGpt, model, **SMALL_GPT)(idx), model(idx))
    assert "blocks.1.w_qkv" in model.state_dict()

    scan = load("scan.lisp")
    model = scan.Scan()
    x, _ = scan_batch()
    assert torch.equal(fresh_copy(scan.Scan, model)(x), model(x))


def test_no_graph_breaks_and_export(load):
    gpt = load("tiny-gpt.lisp")
    model = gpt.TinyGpt(**SMALL_GPT)
    idx, targets = gpt_batch(SMALL_GPT["vocab"])
    explanation = torch._dynamo.explain(model.loss)(idx, targets)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    exported = torch.export.export(model, (idx,))
    assert torch.equal(exported.module()(idx), model(idx))

    scan = load("scan.lisp")
    model = scan.Scan()
    x, _ = scan_batch()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    exported = torch.export.export(model, (x,))
    assert torch.equal(exported.module()(x), model(x))


@pytest.fixture
def emulated_casts():
    """Make inductor round where eager rounds.

    By default (emulate_precision_casts=False) inductor fuses `.to(torch.bfloat16)`
    followed by an f32 use into one kernel that keeps the f32 value, so a :bf16
    module's compiled forward differs from eager by bf16 roundings (measured on
    tiny-gpt: 9e-3 on logits of size ~2). With emulation the compiled forward is
    within 1e-7 of eager; what remains is summation order, hence the tolerances.
    """
    config = torch._inductor.config
    before = config.emulate_precision_casts
    config.emulate_precision_casts = True
    torch._dynamo.reset()
    yield
    config.emulate_precision_casts = before
    torch._dynamo.reset()


def gradients(model, loss_of):
    model.zero_grad()
    loss = loss_of()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def assert_compiled_matches_eager(model, loss_of, compiled_loss_of, grad_tolerance):
    """Loss within 1e-5; each gradient within `grad_tolerance` of its largest entry."""
    eager_loss, eager_grads = gradients(model, loss_of)
    compiled_loss, compiled_grads = gradients(model, compiled_loss_of)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-5)
    for compiled, eager in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(
            compiled, eager, rtol=0, atol=grad_tolerance * eager.abs().max().item()
        )


def test_torch_compile_fullgraph_forward_and_backward(load):
    """The whole forward and backward captured as one graph each (aot_eager: the
    ATen graphs that inductor would lower, run as they are, so eager values)."""
    gpt = load("tiny-gpt.lisp")
    model = gpt.TinyGpt(**SMALL_GPT)
    perturb(model)
    idx, targets = gpt_batch(SMALL_GPT["vocab"])
    torch._dynamo.reset()
    compiled_loss = torch.compile(model.loss, fullgraph=True, backend="aot_eager")
    assert_compiled_matches_eager(
        model,
        lambda: model.loss(idx, targets),
        lambda: compiled_loss(idx, targets),
        grad_tolerance=1e-6,
    )


def test_torch_compile_inductor_matches_eager_with_emulated_casts(load, emulated_casts):
    gpt = load("tiny-gpt.lisp")
    model = gpt.TinyGpt(**SMALL_GPT, n_layer=1)  # one layer: half the compile time
    perturb(model)
    idx, _ = gpt_batch(SMALL_GPT["vocab"])
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(idx), model(idx), rtol=0, atol=1e-5)

    scan = load("scan.lisp")
    model = scan.Scan()
    x, y = scan_batch()
    compiled = torch.compile(model, fullgraph=True)
    assert_compiled_matches_eager(
        model,
        lambda: scan_loss(model, x, y),
        lambda: scan_loss(compiled, x, y),
        grad_tolerance=0.02,
    )
