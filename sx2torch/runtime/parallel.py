"""The process group, and FSDP2's units over a generated module.

A generated module calls its own methods directly: the loss calls `self.forward`, a block's
forward calls `self.attend`, a stack's loop calls a layer's `forward_bf16`. FSDP2 gathers a
unit's parameters before a forward and frees them after it; a method registered with
`register_fsdp_forward_method` is such a forward wherever it is called from. Registered for
every method, a call of one method from another of the same unit freed the unit's parameters
when the inner one returned, and what the outer one read after it was a shard ("aten.mul.Tensor
got mixed torch.Tensor and DTensor"). So a unit is gathered for the whole of its outermost call
only: each method is an entry, and calls made while the unit is already running go straight to
the method.

The units are the root's sub-models (each layer of a stack) and then the root, each holding
the parameters of everything inside it, except those of a sub-model whose parameters are read
by code of another module (a tied weight, `self.lm_head.weight`, or a sub-model's forward
inlined into its parent's): such a sub-model is no unit of its own, and its parameters are
gathered with its reader's. Which parameters each method reads is seen once, in one call of
the loss on the first batch, before the model is sharded.

`tensor_parallel` splits a generated model's linear layers across a 1-D mesh as the plan the
compiler derived (the class's TP_PLAN and TP_REDUCE) says, with DTensor.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import os

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["init_process_group", "fully_shard_units", "tensor_parallel"]


def init_process_group(device: torch.device, rank: int, world: int) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "MASTER_ADDR" in os.environ:  # started by torchrun
        dist.init_process_group(
            backend, device_id=device if backend == "nccl" else None
        )
    else:  # one process without torchrun: a group of one, for trying --parallel out
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=rank, world_size=world
        )


def tensor_parallel(model: nn.Module, mesh, plan=None, reduce=None) -> nn.Module:
    """Split `model`'s linear layers across the 1-D `mesh`, in place: `plan` (module path,
    `*` for each layer of a stack -> "colwise", "rowwise" or "colwise_gather_output")
    defaults to the class's TP_PLAN, `reduce` (a rowwise layer's all-reduce, "f32" or
    "bf16") to its TP_REDUCE. Each split weight becomes a DTensor; the layers between take
    and give each device's share as plain tensors, and every other weight stays whole.
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    from sx2torch.runtime.styles import Colwise, Rowwise

    kind = type(model)
    if plan is None and not hasattr(kind, "TP_PLAN"):
        raise ValueError(
            f"{kind.__name__} has no TP_PLAN: the compiler found no linear layer to split "
            "(`sx2torch explain` says why of each weight)"
        )
    plan = kind.TP_PLAN if plan is None else plan
    reduce = reduce or getattr(kind, "TP_REDUCE", "f32")
    styles = {
        "colwise": (Colwise(), 0),
        "rowwise": (Rowwise(reduce), 1),
        "colwise_gather_output": (Colwise(output_layouts=Replicate()), 0),
    }
    heads = getattr(kind, "TP_HEADS", {})
    modules = dict(model.named_modules())
    # every split is checked before any weight moves: a refusal leaves the model whole
    for path, name in plan.items():
        if name not in styles:
            raise ValueError(f"{path}: unknown style {name!r} (known: {list(styles)})")
        found = [m for m in modules if _matches(m, path)]
        if not found:
            raise ValueError(f"the plan names {path!r}, no module of {kind.__name__}")
        for found_path in found:
            weight = getattr(modules[found_path], "weight", torch.empty(0, 0))
            _divides(found_path, weight, styles[name][1], mesh.size())
            if path in heads:
                _whole_heads(model, found_path, weight, heads[path], mesh.size())
    for path, name in plan.items():
        parallelize_module(model, mesh, {path: styles[name][0]})
    return model


def _matches(name: str, path: str) -> bool:
    """`*` stands for one module name, as in torch's plans."""
    return name.count(".") == path.count(".") and fnmatch.fnmatchcase(name, path)


def _divides(path: str, weight: torch.Tensor, axis: int, ways: int) -> None:
    size = weight.shape[axis]
    if size % ways:
        raise ValueError(
            f"{path}: its weight's {('rows', 'columns')[axis]} ({size}) do not split "
            f"evenly across {ways} devices"
        )


def _whole_heads(model, path: str, weight: torch.Tensor, head, ways: int) -> None:
    """A colwise layer whose output the module splits into heads: each device's rows must
    be whole heads, or the heads' reshape fails when the module runs. `head` is TP_HEADS'
    entry: the head's size, a number or an attribute's path with the plan's `*` (the
    layer's own index here), or a list of them multiplied."""
    terms = head if isinstance(head, list) else [head]
    parent = path.rpartition(".")[0]
    named = [
        t if isinstance(t, int) else f"{parent}.{t.rpartition('.')[2]}".lstrip(".")
        for t in terms
    ]
    size = math.prod(
        t if isinstance(t, int) else functools.reduce(getattr, t.split("."), model)
        for t in named
    )
    rows, count = weight.shape[0], weight.shape[0] // size
    if rows % size or count % ways:
        what = " x ".join(str(t) for t in named)
        raise ValueError(
            f"{path}: its {rows} rows are {count} head{'s' * (count != 1)} of {size} "
            f"({what}), which do not split whole across {ways} devices"
        )


def fully_shard_units(model: nn.Module, call, mesh=None) -> list:
    """Shard the units (see the module's docstring) bottom-up across `mesh` (default: every
    process), `call()` running the loss once to see what each method reads; the units'
    names."""
    from torch.distributed.fsdp import fully_shard

    candidates = _candidates(model)
    joined = _read_outside(candidates, call)
    units = [(n, m) for n, m in candidates if m not in joined] + [("", model)]
    for _, unit in units:
        methods = _methods(unit)
        fully_shard(unit, mesh=mesh)
        _Entries(unit, methods)
    return [name for name, _ in units]


def _candidates(model: nn.Module) -> list:
    """The root's sub-models, each layer of a stack counted as one."""
    found = []
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            found += [(f"{name}.{i}", layer) for i, layer in enumerate(child)]
        else:
            found.append((name, child))
    return found


def _methods(module: nn.Module) -> list:
    """The methods the generated class defines, `forward` and its specializations among them."""
    return [
        name
        for name, value in vars(type(module)).items()
        if callable(value) and not name.startswith("_")
    ]


class _Entries:
    """Counts the calls in progress into one unit, so that FSDP gathers its parameters at the
    outermost call and frees them when that call returns. `module(...)` enters through
    FSDP's own hooks; a direct call of a method enters through its registered wrapper.
    """

    def __init__(self, unit: nn.Module, methods: list):
        from torch.distributed.fsdp import register_fsdp_forward_method

        self.depth = 0
        unit.register_forward_pre_hook(self._enter)
        unit.register_forward_hook(self._leave, always_call=True)
        for name in methods:
            if name == "forward":
                continue  # `module(...)` runs FSDP's hooks; a direct call comes from inside
            plain = getattr(unit, name)
            register_fsdp_forward_method(unit, name)
            setattr(unit, name, self._entry(plain, getattr(unit, name)))

    def _enter(self, *_):
        self.depth += 1

    def _leave(self, *_):
        self.depth -= 1

    def _entry(self, plain, gathering):
        @functools.wraps(plain)
        def method(*args, **kwargs):
            if self.depth:
                return plain(*args, **kwargs)
            self.depth += 1
            try:
                return gathering(*args, **kwargs)
            finally:
                self.depth -= 1

        return method


def _read_outside(candidates: list, call) -> set:
    """The candidate units whose parameters `call()` reads while none of their methods runs
    (only a parent calls a sub-model, so a unit runs while anything inside it runs)."""
    unit_of = {
        id(p): unit for _, unit in candidates for p in unit.parameters()
    }  # a candidate's parameters, its sub-models' included
    running: list = []
    outside = set()

    class Reads(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            for value in _flat((*args, *(kwargs or {}).values())):
                unit = unit_of.get(id(value))
                if unit is not None and unit not in running:
                    outside.add(unit)
            return func(*args, **(kwargs or {}))

    patched = [
        (m, name) for _, c in candidates for m in c.modules() for name in _methods(m)
    ]
    for module, name in patched:
        setattr(module, name, _tracked(getattr(module, name), module, running))
    try:
        with Reads():
            call()
    finally:
        for module, name in patched:
            delattr(module, name)
    return outside


def _flat(values) -> list:
    """The operands of a call, those in a list (`torch.cat([...])`) included."""
    return [
        v
        for value in values
        for v in (value if isinstance(value, (list, tuple)) else [value])
    ]


def _tracked(plain, module: nn.Module, running: list):
    @functools.wraps(plain)
    def method(*args, **kwargs):
        running.append(module)
        try:
            return plain(*args, **kwargs)
        finally:
            running.pop()

    return method
