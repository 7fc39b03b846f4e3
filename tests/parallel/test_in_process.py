"""Tensor parallelism in this process, on a mesh of one (no torchrun): tensor_parallel's errors,
and gradient clipping where it split some parameters and left the others whole: torch's
clip_grad_norm_ refuses the mix of DTensors and tensors (and of DTensors on two meshes, as
FSDP2 over tensor parallelism gives); the training loop's gives torch's clipped gradients.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from cases import lisp
from conftest import load_module
from models.test_llama import SIZES
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime.parallel import tensor_parallel
from sx2torch.runtime.train import _clip_grad_norm


@pytest.fixture
def group(monkeypatch):
    # init_process_group wraps sys.excepthook and destroy_process_group leaves the wrapper
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def compiled(name: str, run=None):
    path = lisp(name)
    module = load_module(compile_source(path.read_text(), path.name, Options(run)))
    return getattr(module, module.__all__[0])


def test_a_model_without_a_plan_or_a_plan_naming_no_module_is_refused(group):
    with pytest.raises(ValueError, match="TinyGpt has no TP_PLAN: .*sx2torch explain"):
        tensor_parallel(compiled("tiny-gpt")(), group)
    model = compiled("llama", "exact")(**SIZES)
    with pytest.raises(ValueError, match="'model.layers.*.attn.q_proj', no module"):
        tensor_parallel(model, group, plan={"model.layers.*.attn.q_proj": "colwise"})
    with pytest.raises(ValueError, match="unknown style 'sideways'"):
        tensor_parallel(model, group, plan={"lm_head": "sideways"})


def test_clipping_split_and_whole_gradients_is_torch_s(group):
    cls = compiled("llama", "exact")
    torch.manual_seed(0)
    whole = cls(**SIZES)
    split = cls(**SIZES)
    split.load_state_dict(whole.state_dict())
    tensor_parallel(split, group)
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    for model in (whole, split):
        model.loss(ids, torch.roll(ids, -1, dims=1)).backward()
    params = list(split.parameters())
    assert {isinstance(p, DTensor) for p in params} == {True, False}
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        nn.utils.clip_grad_norm_(params, 1e9)  # the mix torch refuses
    norm = nn.utils.clip_grad_norm_(whole.parameters(), 0.1)
    assert norm > 0.1  # the clip scales
    _clip_grad_norm(params, 0.1)
    for (name, p), q in zip(whole.named_parameters(), params):
        got = q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad
        assert torch.allclose(got, p.grad, rtol=1e-5, atol=1e-9), name


class _Devices:
    """A mesh of `ways` devices, as far as tensor_parallel reads one before it splits
    anything: its size. The checks below refuse before any weight moves or any process
    group is asked for."""

    def __init__(self, ways: int):
        self.ways = ways

    def size(self) -> int:
        return self.ways


@pytest.mark.parametrize(
    "sizes, weight, message",
    [
        # one key-value head of 16 (multi-query attention): k_proj's 16 rows split evenly
        # into 2, each half a head, which the heads' reshape refused deep in the forward
        (
            {"num_key_value_heads": 1},
            "model.layers.0.self_attn.k_proj",
            r"its 16 rows are 1 head of 16 \(model.layers.0.self_attn.head_dim\), "
            r"which do not split whole across 2 devices",
        ),
        # six heads of 8: 48 rows split evenly into 4 (12 rows each), 1.5 heads
        (
            {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 6},
            "model.layers.0.self_attn.q_proj",
            r"its 48 rows are 6 heads of 8 \(model.layers.0.self_attn.head_dim\), "
            r"which do not split whole across 4 devices",
        ),
    ],
)
def test_heads_that_do_not_split_whole_are_refused_before_anything_splits(
    sizes, weight, message
):
    model = compiled("llama", "exact")(**{**SIZES, **sizes})
    ways = 2 if sizes["num_key_value_heads"] == 1 else 4
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=f"^{weight}: {message}"):
        tensor_parallel(model, _Devices(ways))
    after = model.state_dict()
    assert all(type(v) is torch.Tensor and torch.equal(v, before[k]) for k, v in after.items())


def test_rows_that_do_not_split_evenly_are_refused_naming_the_weight_and_the_devices():
    model = compiled("llama", "exact")(**{**SIZES, "intermediate_size": 90})
    with pytest.raises(
        ValueError,
        match=r"^model.layers.0.mlp.gate_proj: its weight's rows \(90\) do not split "
        r"evenly across 4 devices",
    ):
        tensor_parallel(model, _Devices(4), plan={"model.layers.*.mlp.gate_proj": "colwise"})
