"""Every public method of every example, called as its callers inside the model call it
(the same tensors: bool masks as bools, integer ids as integers, bf16 activations as bf16),
gives the numbers those calls give (docs/LANGUAGE.md, "Specializations": a public method
takes each argument in the kind its callers pass; a bool is never made a float).

The model's own methods are wrapped to record each call made while its entry points run
(the method called, its arguments and its value); then the public method of the same
source name is called on the recorded arguments. A method of its own whose computation
differs from the public method's by a value computed in another dtype is the documented
exception (listed below with its reason); one that differs only by an argument's kind is
not allowed to exist.
"""

from __future__ import annotations

import re

import pytest
import torch

from cases import BART, WHISPER, lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source
from interpret.test_interpret_examples import CASES
from models.test_mamba import SIZES as MAMBA
from models.test_t5 import SIZES as T5
from models.test_ports import MEDIUM, SIZES, WINDOWS

# The examples the interpreter's test does not run, in small sizes, and their inputs.
OTHERS = {
    "distill": (dict(d=8), lambda: [torch.randn(4, 8)]),
    "energy": (dict(hidden=8), lambda: [torch.randn(5, 3)]),
    "rms-mlp": (dict(d_in=16, d_hidden=8, n_class=4), lambda: [torch.randn(5, 16)]),
    "scan": (dict(d=8), lambda: [torch.randn(2, 6, 8)]),
    "mamba": (MAMBA, lambda: [torch.randint(0, 256, (2, 7))]),
    "t5": (T5, lambda: [torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 5))]),
    "bart": (
        BART,
        lambda: [torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 5))],
    ),
    "whisper": (
        WHISPER,
        lambda: [torch.randn(2, 8, 20), torch.randint(0, 64, (2, 5))],
    ),
    "modded-nanogpt-simple": (SIZES, lambda: [torch.randint(0, 64, (2, 16))]),
    "modded-nanogpt-medium": (
        {**MEDIUM, **WINDOWS},
        lambda: [torch.randint(0, 300, (1, 40))],
    ),
    "convnext": (
        dict(patch_size=2, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1]),
        lambda: [torch.randn(2, 3, 16, 16)],
    ),
    "deepseek-v3": (
        dict(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            moe_intermediate_size=8,
            num_hidden_layers=2,
            num_attention_heads=2,
            n_routed_experts=4,
            kv_lora_rank=8,
            q_lora_rank=8,
            qk_rope_head_dim=4,
            v_head_dim=4,
            qk_nope_head_dim=4,
            n_group=2,
            topk_group=1,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
        ),
        lambda: [torch.randint(0, 64, (2, 5))],
    ),
}
EXAMPLES = {**CASES, **OTHERS}
# Entry points other than forward that call public methods of their model, and their
# arguments made from forward's.
ENTRIES = {
    "distill": {"loss": lambda args: args},
    "energy": {"loss": lambda args: [*args, torch.randn_like(args[0])]},
}
# The examples whose forward calls no method of theirs.
LEAVES = {"scan"}
# (example, class, method) -> why that method computes something its public method does
# not, on the same arguments (docs/LANGUAGE.md, "Specializations").
OWN: dict = {}
# `# PUBLIC for ARGUMENT: DTYPE, ...` above a specialization's `def NAME(`
_SPECIALIZATION = re.compile(r"^    # (\w+) for [^\n]*\n    def (\w+)\(", re.M)


def test_every_example_is_checked():
    assert sorted(EXAMPLES) == sorted(
        p.stem for p in lisp("bert").parent.glob("*.lisp")
    )


class Recorder:
    """Wraps each generated method of each module instance to record the calls made
    inside the model: (instance, method name, arguments, value)."""

    def __init__(self, model: torch.nn.Module, classes: set):
        self.calls: list = []
        self.depth = 0
        for instance in model.modules():
            if type(instance) in classes:
                for name, function in vars(type(instance)).items():
                    if callable(function) and not name.startswith("__"):
                        setattr(instance, name, self._wrap(instance, name, function))

    def _wrap(self, instance, name, function):
        def recorded(*args, **kwargs):
            self.depth += 1
            try:
                value = function(instance, *args, **kwargs)
            finally:
                self.depth -= 1
            if self.depth > 0:
                self.calls.append((instance, name, args, kwargs, value))
            return value

        return recorded


def _leaves(value) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _runs(name: str) -> list:
    return [
        line.split()[1]
        for line in lisp(name).read_text().splitlines()
        if line.startswith("(defrun")
    ]


@pytest.mark.parametrize(
    "name,run", [(name, run) for name in sorted(EXAMPLES) for run in _runs(name)]
)
def test_public_methods_called_as_their_callers_call_them(name, run):
    consts, inputs = EXAMPLES[name]
    code = compile_source(lisp(name).read_text(), f"{name}.lisp", Options(run=run))
    public = {method: of for of, method in _SPECIALIZATION.findall(code)}
    module = load_module(code)
    classes = {
        v
        for v in vars(module).values()
        if isinstance(v, type) and v.__module__ == module.__name__
    }
    torch.manual_seed(0)
    model = getattr(module, module.__all__[0])(**consts).eval()
    with torch.no_grad():  # norms' ones and biases' zeros would hide arithmetic
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    recorder = Recorder(model, classes)
    args = inputs()
    for entry, arguments in {"forward": list, **ENTRIES.get(name, {})}.items():
        getattr(model, entry)(*arguments(args))
    checked = 0
    for instance, method, call_args, kwargs, value in recorder.calls:
        of = public.get(method, method)
        if (name, type(instance).__name__, method) in OWN:
            continue
        got = getattr(type(instance), of)(instance, *call_args, **kwargs)
        for g, w in zip(_leaves(got), _leaves(value), strict=True):
            where = f"{type(instance).__name__}.{of} as {method} is called"
            assert g.dtype == w.dtype, where
            assert torch.equal(g, w), f"{where}: {(g.float() - w.float()).abs().max()}"
        checked += 1
    assert (checked > 0) is (name not in LEAVES)
