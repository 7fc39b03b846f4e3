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
