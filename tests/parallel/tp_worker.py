"""Run by torchrun (gloo, CPU) from test_tensor_parallel.py: WORK holds the compiled modules
and transformers' checkpoint; each check's figures go to WORK/results.json (rank 0)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, as pytest has it

from models.test_llama import SIZES as LLAMA  # noqa: E402  (the ports' tests' sizes)
from models.test_mixtral import SIZES as MIXTRAL  # noqa: E402
from sx2torch.runtime.parallel import tensor_parallel  # noqa: E402


def load(path: Path):
    """The module's top class, and the module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, module.__all__[0]), module


def ids(length: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (2, length), generator=torch.Generator().manual_seed(7)
    )


def against_one(cls, sizes: dict, mesh) -> dict:
    """The split model's logits and one split weight's gradient against one process's."""
    torch.manual_seed(0)
    one = cls(**sizes)
    with torch.no_grad():  # transformers' init leaves a router's weights small
        for p in one.parameters():
            p.normal_(0.0, 0.05)
    split = cls(**sizes)
    split.load_state_dict(one.state_dict())
    tensor_parallel(split, mesh)
    tokens = ids(11)
    want, got = one(tokens), split(tokens)
    targets = torch.roll(tokens, -1, dims=1)
    one.loss(tokens, targets).backward()
    split.loss(tokens, targets).backward()
    q = "model.layers.1.self_attn.q_proj.weight"
    grads = dict(one.named_parameters())[q].grad, dict(split.named_parameters())[q].grad
    return {
        "logits": (got - want).abs().max().item(),
        "scale": want.abs().max().item(),
        "tokens": torch.equal(got.argmax(-1), want.argmax(-1)),
        "grad": (grads[1].full_tensor() - grads[0]).abs().max().item(),
        "split": type(split.model.layers[0].self_attn.o_proj.weight).__name__,
    }


def llama_pair(cls, mesh) -> tuple:
    """The tiny Llama on one process, and a copy of it split across `mesh`."""
    torch.manual_seed(0)
    one = cls(**LLAMA)
    split = cls(**LLAMA)
    split.load_state_dict(one.state_dict())
    tensor_parallel(split, mesh)
    return one, split


def bf16_model(cls, mesh) -> dict:
    """The bf16 Llama with the default f32 reduction against one process: the share of
    logits that differ, and a step's backward through the split layers."""
    one, split = llama_pair(cls, mesh)
    tokens = ids(16)
    with torch.no_grad():
        want, got = one(tokens), split(tokens)
    split.loss(tokens, torch.roll(tokens, -1, dims=1)).backward()
    o_proj = split.model.layers[0].self_attn.o_proj.weight
    return {
        "differ": (got != want).float().mean().item(),
        "dtype": str(got.dtype),
        "grad": type(o_proj.grad).__name__,
    }


def with_transformers(work: Path, cls, mesh) -> dict:
    """:tp-reduce :bf16 against transformers' own tp_plan="auto", both in bf16."""
    from transformers import LlamaForCausalLM
    from transformers.distributed import DistributedConfig

    real = LlamaForCausalLM.from_pretrained(
        work / "llama",
        dtype=torch.bfloat16,
        distributed_config=DistributedConfig(tp_plan="auto"),
    ).eval()
    ours = cls(**LLAMA)
    ours.load_state_dict(LlamaForCausalLM.from_pretrained(work / "llama").state_dict())
    tensor_parallel(ours, mesh)
    tokens = ids(16)
    with torch.no_grad():
        got, want = ours(tokens), real(tokens).logits
    return {"equal": torch.equal(got, want), "dtype": str(got.dtype)}


def gemm(cls, mesh) -> dict:
    """A row-parallel bf16 GEMM [256, 1024] x [1024, 512] against one device's: the share
    of outputs that differ, with each reduction."""
    torch.manual_seed(1)
    x = torch.randn(256, 1024)
    one = cls(in_features=1024, out_features=512)
    want = one(x)
    shares = {}
    for reduce in ("f32", "bf16"):
        split = cls(in_features=1024, out_features=512)
        split.load_state_dict(one.state_dict())
        tensor_parallel(split, mesh, plan={"": "rowwise"}, reduce=reduce)
        local = x.chunk(mesh.size(), dim=-1)[mesh.get_local_rank()]
        with torch.no_grad():
            got = split(local)
        assert got.dtype == want.dtype == torch.bfloat16
        shares[reduce] = (got != want).float().mean().item()
    return shares


def generated(cls, mesh) -> dict:
    """Greedy generation (f32) of the split Llama against one process's, with either
    cache: the tokens, and the shapes of what each generation's cache holds."""
    from sx2torch.runtime.cache import Cache

    # the module, which sx2torch.runtime's `generate` (the function) hides
    driver = importlib.import_module("sx2torch.runtime.generate")

    caches = []

    class Kept(Cache):  # the cache each generate call makes, to look into after it
        def __init__(self, *args):
            super().__init__(*args)
            caches.append(self)

    driver.Cache = Kept
    one, split = llama_pair(cls, mesh)
    prompt = ids(7)
    got = {}
    compile_step, torch.compile = torch.compile, lambda module, **options: module
    try:  # the static cache eagerly: inductor's build would take most of a minute
        for static in (False, True):
            want = driver.generate(one, prompt, 8, static_cache=static)
            tokens = driver.generate(split, prompt, 8, static_cache=static)
            got["static" if static else "dynamic"] = torch.equal(tokens, want)
    finally:
        torch.compile = compile_step
    got["held"] = [sorted({tuple(t.shape) for t in c.keys + c.values}) for c in caches]
    return got


def refused(cls, mesh) -> str:
    """tensor_parallel's message for a Llama with one key-value head on the 2 processes
    (k_proj's rows split evenly, each half a head), and whether the model stayed whole."""
    model = cls(**{**LLAMA, "num_key_value_heads": 1})
    try:
        tensor_parallel(model, mesh)
    except ValueError as error:
        whole = not any(isinstance(p, DTensor) for p in model.parameters())
        return f"{error} (whole: {whole})"
    return "split"


def main(work: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    results = {
        "llama": against_one(load(work / "llama_f32.py")[0], LLAMA, mesh),
        "mixtral": against_one(load(work / "mixtral_f32.py")[0], MIXTRAL, mesh),
        "gemm": gemm(load(work / "llama_bf16.py")[1].LinearLayer, mesh),
        "bf16": bf16_model(load(work / "llama_bf16.py")[0], mesh),
        "transformers": with_transformers(
            work, load(work / "llama_tp_bf16.py")[0], mesh
        ),
        "generate": generated(load(work / "llama_generate.py")[0], mesh),
        "refused": refused(load(work / "llama_f32.py")[0], mesh),
    }
    if dist.get_rank() == 0:
        (work / "results.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
