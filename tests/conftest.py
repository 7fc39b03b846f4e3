"""Shared fixtures: compile SexpGPU text and import the generated module."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest
import torch

# Python's bytecode cache, on for the suite even where PYTHONDONTWRITEBYTECODE turns it off
# (as container images often do): without it each xdist worker compiles every test module
# and re-writes its asserts (5 of a worker's 13 CPU seconds of collection), and every
# subprocess a test starts compiles sx2torch again. The caches are __pycache__ folders,
# which git ignores. Set before sx2torch's first import, and in the environment the tests'
# subprocesses inherit.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from sx2torch.compiler import Options, compile_source  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite golden/*.py from golden/*.lisp",
    )


# The files that take longest (CPU seconds measured with a cold inductor cache: the
# held-target compiles, a torchrun launch, training scripts run as a user runs them), run
# first so that under `--dist loadfile` no worker starts one while the other runs out of work.
SLOWEST_FIRST = [
    "targets/test_target_equivalence.py",
    "train/test_distributed.py",
    "parallel/test_tensor_parallel.py",
    "train/test_script.py",
    "models/test_ports.py",
    "runtime/test_compiling.py",
    "models/test_stdlib_models.py",
    "runtime/test_rounding.py",
    "test_fuzz.py",
    "models/test_llama.py",
    "driver/test_pipeline.py",
    "test_determinism.py",
    "test_gpu_check.py",
    "driver/test_cli.py",
]


def pytest_configure(config):
    """Under pytest-xdist each worker takes its share of the cores for torch's threads:
    two workers of two threads each on two cores wait on each other. Files are handed out
    in SLOWEST_FIRST's order, not xdist's default of the most tests first (which left the
    few-test, long files to the end)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    gone = [name for name in SLOWEST_FIRST if not (here / name).is_file()]
    if gone:
        raise pytest.UsageError(f"conftest.SLOWEST_FIRST names no such file: {gone}")
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}

    def slowness(item):
        inside = item.path.is_relative_to(here)
        return rank.get(
            item.path.relative_to(here).as_posix() if inside else "", len(rank)
        )

    items.sort(
        key=slowness
    )  # stable: the other files, and each file's tests, keep their order


@pytest.fixture(autouse=True, scope="session")
def _format_cache(tmp_path_factory):
    """Compiles (in-process and in the CLI's subprocesses) keep black's results in a
    temporary folder, never in the user's home: one for the run, which its xdist workers
    share (a module two workers compile is formatted once; entries are written whole).
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    folder = base / "format-cache"
    folder.mkdir(exist_ok=True)
    os.environ["SX2TORCH_CACHE_DIR"] = str(folder)
    os.environ.pop("SX2TORCH_NO_CACHE", None)


def load_module(code: str, name: str = "generated") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(code, f"<{name}>", "exec"), module.__dict__)
    return module


def refused_alike(text: str) -> "SourceError":
    """The compiler's diagnostic for `text`, which the interpreter's front end (the same
    passes) gives too."""
    from sx2torch import interpret
    from sx2torch.errors import SourceError

    with pytest.raises(SourceError) as caught:
        compile_source(text, "model.lisp")
    error = caught.value
    with pytest.raises(SourceError) as caught:
        interpret.load(text)
    assert caught.value.message == error.message
    return error


def method_code(code: str, name: str) -> str:
    """The text of generated method `name`, up to the next method."""
    return code.split(f"    def {name}(")[1].split("\n    def ")[0]


def class_code(code: str, header: str) -> str:
    """The text of the generated class whose line is `header`, up to the next class."""
    return code.split(f"class {header}:")[1].split("\nclass ")[0]


def seed_cpu(value: int) -> None:
    """`torch.manual_seed(value)` for the CPU's generator, the one the suite draws from:
    torch.manual_seed also queues the seed for CUDA, XPU and MTIA until they start, formatting
    the Python stack for each (about 1 ms a call under pytest's stack), and the target
    comparisons and the interpreter's public-entry checks seed 5,000 times."""
    torch.default_generator.manual_seed(value)


def seeded_model(source: str):
    """(the compiled source's Model, drawn from seed 0, and its code)."""
    code = compile_source(source, "model.lisp")
    torch.manual_seed(0)
    return load_module(code).Model(), code


@pytest.fixture
def build():
    """build(source, filename="model.lisp", run=None, target="cuda") -> (module, code)."""

    def compile_and_load(
        source: str, filename: str = "model.lisp", run=None, target: str = "cuda"
    ):
        code = compile_source(source, filename, Options(run=run, target=target))
        return load_module(code), code

    return compile_and_load


def adamw_losses(model, ids, targets, steps: int, lr: float = 3e-3) -> list:
    """The losses of `steps` AdamW steps on one batch: a model that trains makes them fall."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model.loss(ids, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def greedy(reference, prompt, steps: int = 32, **options):
    """transformers' greedy `generate` of `steps` tokens, with each step's logits."""
    return reference.generate(
        prompt,
        do_sample=False,
        max_new_tokens=steps,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        **options,
    )


def calls_counted(**modules) -> dict:
    """{name: how many times the module of that name is called from now on} (forward
    pre-hooks)."""
    calls = dict.fromkeys(modules, 0)
    for name, module in modules.items():

        def hook(module, args, name=name):
            calls[name] += 1

        module.register_forward_pre_hook(hook)
    return calls


def assert_generated(tokens, logits, want) -> None:
    """sx2torch's generate gave `want`'s tokens, and its logits bit for bit at every step,
    in f32 as transformers' `output_logits`."""
    assert torch.equal(tokens, want.sequences)
    assert len(logits) == len(want.logits)
    for step, (got, expected) in enumerate(zip(logits, want.logits)):
        assert got.dtype == torch.float32 and got.shape == expected.shape
        assert torch.equal(got, expected), f"step {step}"


def compiled_once(monkeypatch, call) -> tuple:
    """(`call()` with torch.compile left out, `call()` compiled by a backend that runs each
    graph as torch does, the graphs it compiled): a recompile is an error."""
    import functools

    graphs = []

    def counting(graph, inputs):
        graphs.append(graph)
        return graph.forward

    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, **options: module)
    eager = call()
    monkeypatch.setattr(torch, "compile", functools.partial(compile, backend=counting))
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            compiled = call()
    finally:
        torch._dynamo.reset()
    return eager, compiled, graphs
