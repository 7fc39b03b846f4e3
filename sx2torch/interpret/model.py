"""The interpreter's model instances: consts evaluated for one instance, parameters held as
the rules store them, sub-models and stacks built in source order."""

from __future__ import annotations

import builtins
import keyword
import math
import operator
from dataclasses import dataclass, field
from typing import Optional

import torch

from sx2torch.ir import Scalar
from sx2torch.ops.initializers import FORMULA_FUNCTIONS
from sx2torch.syntax.program import LISTS, Model, Param, Program

FOLDS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "**": operator.pow,
    "%": operator.mod,
}
COMPARES = {
    "==": operator.eq,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
# A const's functions, as Python computes them where the module is built.
FUNCTIONS = {
    "int": int,
    "floor": math.floor,
    "ceil": math.ceil,
    "log": math.log,
    "exp": math.exp,
    "sqrt": math.sqrt,
}


# How a source name is spelled in a state_dict key (docs/LANGUAGE.md, "Names").
SPELLED = {"-": "_", "*": "_star", "?": "_p", "!": "_bang", "+": "_plus", "/": "_slash"}
SPELLED.update(
    {"<": "_lt", ">": "_gt", "=": "_eq", "&": "_and", ".": "_dot", "%": "_pct"}
)


# Names a method of the module cannot take, which get a trailing `_`.
RESERVED = {
    *keyword.kwlist,
    *keyword.softkwlist,
    *dir(builtins),
    "torch",
    "nn",
    "F",
    "sx",
}
RESERVED |= {"self", "super", *(a for a in dir(torch.nn.Module) if a[0] != "_")}
RESERVED -= {"forward"}


def key(name: str) -> str:
    """A parameter's or sub-model's state_dict key: never a trailing `_` (`attention.self`)."""
    text = "".join(SPELLED.get(c, c) for c in name)
    return "v" + text if text[0].isdigit() or text[0] == "_" else text


def method(name: str) -> str:
    """A defun's method name in the module."""
    text = key(name)
    return text + "_" if text in RESERVED else text


def scalar(s: Scalar, env: dict):
    """A compile-time scalar's value with the consts, keys and layer index of `env`."""
    if s.op == "lit":
        return s.value
    if s.op in ("const", "key", "layer"):
        return env.get(s.args[0], s.value)
    values = [scalar(a, env) if isinstance(a, Scalar) else a for a in s.args]
    if s.op in FOLDS:
        result = values[0]
        for v in values[1:]:
            result = FOLDS[s.op](result, v)
        return result
    if s.op in COMPARES:
        return COMPARES[s.op](*values)
    if s.op == "and":
        return values[0] and values[1]
    if s.op == "or":
        return values[0] or values[1]
    if s.op == "not":
        return not values[0]
    if s.op == "neg":
        return -values[0]
    if s.op in FUNCTIONS:
        return FUNCTIONS[s.op](values[0])
    if s.op == "in":
        options = s.args[1]
        if isinstance(options, Scalar):  # a list const or &key
            return values[0] in values[1]
        return values[0] in [scalar(o, env) for o in options]
    if s.op == "if":
        return values[1] if values[0] else values[2]
    if s.op == "list":
        return tuple(values)
    if s.op == "at":
        return values[0][values[1]]
    if s.op == "len":
        return len(values[0])
    raise ValueError(f"unknown compile-time operation {s.op!r}")


@dataclass
class ParamValue:
    """A parameter as stored: an f32 master, or bf16 for `:dtype :bf16`."""

    name: str
    tensor: torch.Tensor
    high: bool = False
    trainable: bool = True
    # an `if` of parameter reads is a read of the one it chose, :numerics :high where any
    # of them is; as a value (a defun's result) it has the join of their dtypes
    joined: Optional[torch.dtype] = None

    def read(self, dtype: torch.dtype) -> torch.Tensor:
        return self.tensor if self.tensor.dtype == dtype else self.tensor.to(dtype)


class WeightNormed(ParamValue):
    """A parameter under torch's weight-norm parametrization: its g and v as stored, read
    as the weight `torch._weight_norm(v, g, dim)` computes from them at each read, as
    torch's parametrization computes it."""

    def __init__(self, param: Param, g: torch.Tensor, v: torch.Tensor, dim: int):
        self.name, self.high, self.trainable, self.joined = (
            param.name,
            param.numerics_high,
            True,
            None,
        )
        self.g, self.v, self.dim = g, v, dim

    @property
    def tensor(self) -> torch.Tensor:
        return torch._weight_norm(self.v, self.g, self.dim)

    def stored(self, prefix: str) -> dict:
        """g and v under torch's keys."""
        return dict(zip(normed_keys(prefix, self.name), (self.g, self.v)))


def normed_keys(prefix: str, name: str) -> tuple:
    """A weight-normed parameter's g and v keys, torch's
    `parametrizations.weight.original0` and `original1`."""
    return tuple(f"{prefix}parametrizations.{key(name)}.original{i}" for i in (0, 1))


@dataclass
class Instance:
    program: Program
    model: Model
    env: dict  # const name -> value
    prefix: str  # its state_dict keys' prefix: "blocks.0."
    params: dict = field(
        default_factory=dict
    )  # name -> ParamValue | Instance | [Instance]
    unmade: dict = field(default_factory=dict)  # name -> its stand-in (stand_in)


def build(
    program: Program,
    model: Model,
    env: dict,
    state: Optional[dict] = None,
    prefix: str = "",
    normed: Optional[tuple] = None,
) -> Instance:
    """An instance with `env`'s const overrides; parameters from `state` (state_dict keys),
    else drawn from torch's generator in source order, as the generated module draws them;
    `normed`, (name, dim), the parameter its weight-norm holds."""
    consts = {}
    for const in model.consts.values():
        consts[const.name] = (
            env[const.name] if const.name in env else scalar(const.value, consts)
        )
    instance = Instance(program, model, consts, prefix)
    for param in model.params.values():
        if param.when is not None and not scalar(param.when, consts):
            continue
        if normed is not None and param.name == normed[0]:
            instance.params[param.name] = _weight_normed(instance, param, normed, state)
            continue
        instance.params[param.name] = _param(program, instance, param, state)
    for tie in model.ties:  # one ParamValue under both names
        *owners, last = tie.name.name.split(".")
        target = _find(instance, tie.target.name.split("."))
        _find(instance, owners).params[last] = target
    return instance


class Sequential(list):
    """A sequential's instances: called, each one's forward on the value before."""


def _find(instance: Instance, parts: list):
    """The member `a.b.weight` (parts ["a", "b", "weight"]) of an instance."""
    for part in parts:
        instance = instance.params[part]
    return instance


def _weight_normed(instance: Instance, param: Param, normed: tuple, state):
    """v drawn where the parameter is, g its norms over every axis but dim, as torch's
    weight_norm computes them from the drawn weight; or both from `state`."""
    dim = normed[1]
    if state is None:
        v = initial(param.init, instance.env)
        return WeightNormed(param, torch.norm_except_dim(v, 2, dim), v, dim)
    g, v = (state[k].detach().float() for k in normed_keys(instance.prefix, param.name))
    return WeightNormed(param, g, v, dim)


def _built(program: Program, init, env: dict, state, prefix: str) -> Instance:
    """An instance `init` makes, its arguments computed with its owner's `env`."""
    norm = init.weight_norm
    normed = norm and (norm.name.name, scalar(norm.dim, env))
    args = {k: scalar(v, env) for k, (_, v) in init.args.items()}
    return build(program, program.model(init.model), args, state, prefix, normed)


def _param(program: Program, instance: Instance, param: Param, state):
    init, env = param.init, instance.env
    name = instance.prefix + key(param.name)
    if init.kind == "choice":
        (init,) = init.built(scalar(init.args["when"], env))
    if init.kind in LISTS:  # items of different models, under `name.0.`, `name.1.`, ...
        kind = Sequential if init.kind == "sequential" else list
        return kind(
            _built(program, item, env, state, f"{name}.{k}.")
            for k, item in enumerate(init.items)
        )
    if init.kind == "model":
        return _built(program, init, env, state, name + ".")
    if init.kind == "stack":
        return [
            _built(
                program,
                init,
                {**env, init.index: i} if init.index else env,
                state,
                f"{name}.{i}.",
            )
            for i in range(scalar(init.count, env))
        ]
    tensor = initial(init, env) if state is None else state[name].detach().float()
    if param.dtype == "bf16":
        tensor = tensor.to(torch.bfloat16)
    return ParamValue(param.name, tensor, param.numerics_high, param.trainable)


def stand_in(instance: Instance, param: Param):
    """A parameter this instance does not make (its `:when` is false), drawn as it would
    be, once: an `if`'s branch not taken reads it for its dtype alone."""
    if param.name not in instance.unmade:
        instance.unmade[param.name] = _param(instance.program, instance, param, None)
    return instance.unmade[param.name]


def initial(init, env: dict) -> torch.Tensor:
    """An initializer's tensor, drawn as the generated `__init__` draws it."""
    args = init.args

    def f(name):
        return float(scalar(args[name], env))

    if init.kind == "concat":
        return torch.cat([initial(part, env) for part in args["parts"]], args["axis"])
    if init.kind == "arange":
        return torch.arange(f("start"), f("end")).float()
    if init.kind in FORMULA_FUNCTIONS:
        return getattr(torch, init.kind)(initial(args["part"], env))
    if init.kind == "outer":
        left, right = initial(args["left"], env), initial(args["right"], env)
        return left[:, None] * right[None, :]
    if init.kind == "arithmetic":
        left, right = (
            f(side) if isinstance(args[side], Scalar) else initial(args[side], env)
            for side in ("left", "right")
        )
        return FOLDS[args["op"]](left, right)
    if init.kind == "repeat":
        return initial(args["part"], env).repeat(scalar(args["count"], env))
    if init.kind == "tensor":
        return torch.tensor([float(scalar(v, env)) for v in args["values"]])
    if init.kind == "eye":
        return torch.eye(scalar(args["n"], env))
    if init.kind == "linspace":
        return torch.linspace(f("start"), f("end"), scalar(args["n"], env))
    if init.kind == "pow":
        return f("base") ** initial(args["part"], env)
    shape = tuple(scalar(s, env) for s in args["shape"])
    if init.kind == "zeros":
        return torch.zeros(shape)
    if init.kind == "ones":
        return torch.ones(shape)
    if init.kind == "full":
        return torch.full(shape, f("value"))
    if init.kind == "normal":
        drawn = torch.normal(f("mean"), f("std"), size=shape)
        row = args.get("padding-idx")
        row = None if row is None else scalar(row, env)
        if row is not None:  # nn.Embedding's padding_idx row, zeroed after the draw
            drawn[row] = 0.0
        return drawn
    if init.kind == "kaiming-uniform":
        return torch.nn.init.kaiming_uniform_(torch.empty(shape), a=f("a"))
    if init.kind == "fan-in-uniform":
        return torch.nn.init.uniform_(torch.empty(shape), f("low"), f("high"))
    return torch.empty(shape).uniform_(f("low"), f("high"))


def instances(instance: Instance):
    """`instance` and every sub-model instance in it, at any depth."""
    yield instance
    for value in instance.params.values():
        for part in value if isinstance(value, list) else [value]:
            if isinstance(part, Instance):
                yield from instances(part)


def state_dict(instance: Instance) -> dict:
    """Every parameter's stored tensor by its state_dict key."""
    found, normed = {}, {}
    for name, value in instance.params.items():
        for part in value if isinstance(value, list) else [value]:
            if isinstance(part, Instance):
                found.update(state_dict(part))
            elif isinstance(part, WeightNormed):  # after the module's own, as torch's
                normed.update(part.stored(instance.prefix))
            else:
                found[instance.prefix + key(name)] = part.tensor
    return found | normed
