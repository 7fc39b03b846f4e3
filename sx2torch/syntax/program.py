"""The program's types: what resolve makes of the top-level forms and every later pass reads
(models with their consts, params and defuns; runs with their optimizers and inputs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from sx2torch.errors import Span
from sx2torch.syntax.scalars import Scalar, ScalarOp
from sx2torch.syntax.read import Datum, List, Symbol, Vector

PRECISIONS = ("f32", "bf16")
RUN_KEYS = (
    "precision",
    "loss",
    "optimizer",
    "steps",
    "batch-size",
    "seq-len",
    "schedule",
    "grad-clip",
    "inputs",
    "generate",
    "tp-reduce",
)
OPTIMIZER_KEYS = {
    "adamw": ("lr", "betas", "weight-decay", "eps"),
    "muon": ("lr", "momentum", "weight-decay", "nesterov", "ns-steps", "adamw"),
}


@dataclass
class Const:
    name: str
    value: Scalar
    span: Span
    # a defflag: read only when the module runs, so setting it on a built module counts
    flag: bool = False
    # a model's &key: the key its instances pass it by where that differs from the name
    # the model reads it by (`((:bias has-bias) true)`, since `bias` names a parameter)
    key: Optional[str] = None
    # a model's &key written without a default: every instance passes it (its value is
    # RUN_VALUE's stand-in for the checks of the model at its defaults)
    required: bool = False

    @property
    def argument(self) -> str:
        """The name its instances pass it by."""
        return self.key or self.name


# The initializers that make sub-models: an instance, a stack of one model's instances, a
# list of instances of different models (nn.Sequential, applied in order, or nn.ModuleList),
# and a choice between two instances by a condition on the consts, under one key.
MODULE_KINDS = ("model", "stack", "sequential", "module-list", "choice")
LISTS = ("sequential", "module-list")


@dataclass
class Init:
    kind: str  # an initializer's name (sx2torch/ops/initializers.py), or a MODULE_KINDS
    args: dict  # name -> Scalar, or a tuple of Scalars for shape
    model: Optional[str] = None
    count: Optional[Scalar] = None
    span: Optional[Span] = None  # a sub-model instance's form, for diagnostics about it
    index: Optional[str] = None  # a stack's layer index, `i` of (stack (i n) ...)
    # a list's instances, or a choice's two (its condition is args["when"])
    items: tuple = ()
    # `(weight-norm (MODEL ...) :name NAME :dim D)`: the instance's parameter NAME held as
    # torch's weight-norm parametrization holds it
    weight_norm: Optional["WeightNorm"] = None

    @property
    def instances(self) -> tuple:
        """The instance initializers (`model` or `stack`) it holds: itself, or its items."""
        return self.items if self.kind in (*LISTS, "choice") else (self,)

    def built(self, when: Optional[bool]) -> tuple:
        """The instance initializers it builds where a choice's condition is `when` (the
        one it chooses; both where `when` is None, not known)."""
        if self.kind != "choice" or when is None:
            return self.instances
        return (self.items[0 if when else 1],)


@dataclass(frozen=True)
class WeightNorm:
    """`torch.nn.utils.parametrizations.weight_norm(instance, name, dim)` of a sub-model
    instance: its parameter `name` (a tensor parameter of its model) stored as
    `parametrizations.NAME.original0` (g, the norms over every axis but `dim`) and
    `original1` (v), and read as torch's `_weight_norm(v, g, dim)` computes it."""

    name: Symbol
    dim: Scalar
    span: Span


@dataclass
class Param:
    name: str
    init: Init
    span: Span
    numerics_high: bool = False
    trainable: bool = True
    # `:persistent false`: a frozen buffer left out of state_dict, computed by its init
    persistent: bool = True
    dtype: Optional[str] = None  # `:dtype`: the stored dtype, whatever the readers read
    # `:when`: a condition on the consts; else always made
    when: Optional[Scalar] = None
    doc: Optional[str] = None  # its docstring, a comment above it in __init__

    @property
    def is_module(self) -> bool:
        return self.init.kind in MODULE_KINDS


@dataclass
class Tie:
    """`(tie NAME TARGET)`: the parameter NAME is TARGET, one nn.Parameter under both keys;
    each a name Program.member reads."""

    name: Symbol
    target: Symbol


@dataclass
class Defun:
    name: str
    args: list  # [Symbol]
    keys: list  # [(Symbol, Datum default)]
    doc: Optional[str]
    body: tuple
    span: Span
    # a top-level defun a sub-model calls, copied into it: it sees only its arguments
    shared: bool = False

    @property
    def arity(self) -> int:
        """How many values it returns: several where its body ends in a vector `[a b]`,
        possibly at the end of a `let` or a `with-numerics` (known before it is traced, so a
        call can bind them)."""
        last = self.body[-1]
        while (
            isinstance(last, List)
            and len(last.items) > 2
            and isinstance(last.items[0], Symbol)
            and last.items[0].name in ("let", "with-numerics")
        ):
            last = last.items[-1]
        return len(last.items) if isinstance(last, Vector) else 1


@dataclass
class Model:
    name: str
    span: Span
    doc: Optional[str] = None
    consts: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    defuns: dict = field(default_factory=dict)
    is_top: bool = False
    ties: list = field(default_factory=list)  # [Tie], in source order
    # a :generate run's copy of a model for one instance (sx2torch/cache.py): (the model,
    # the instance's parameter)
    copy_of: Optional[tuple] = None
    # state_dict key -> the parameter that has it, as resolve reads them: a name that
    # meets another's key is found without comparing it with every parameter
    keys: dict = field(default_factory=dict, repr=False, compare=False)

    def lookup_const(self, name: str) -> Optional[Scalar]:
        const = self.consts.get(name)
        if const and const.value.op is ScalarOp.LAYER:
            return const.value
        return Scalar(ScalarOp.CONST, (name,), const.value.value) if const else None

    def names(self) -> set:
        """The names defined so far in this model."""
        return {*self.consts, *self.params, *self.defuns}


@dataclass
class Optimizer:
    kind: str  # an OPTIMIZER_KEYS name
    settings: dict  # Python names (weight_decay) -> numbers, a tuple for betas
    rest: Optional["Optimizer"] = None  # muon's AdamW, for what Muon does not take


@dataclass
class Input:
    """A synthetic batch argument: normal floats, or integers in [0, high)."""

    name: Symbol
    shape: tuple  # data until resolve's check_run evaluates it, then ints
    high: Optional[Datum]  # then an int


@dataclass
class Run:
    name: str
    precision: str
    span: Span
    # the defun whose scalar is trained; None: not trainable
    loss: Optional[Symbol] = None
    optimizer: Optional[Optimizer] = None
    steps: Optional[int] = None
    batch_size: Optional[int] = None
    seq_len: Optional[int] = None
    warmup: float = 0.0  # fractions of the steps
    cooldown: float = 0.0
    grad_clip: Optional[float] = None
    inputs: Optional[list] = None  # [Input]: synthetic batches instead of token data
    # `:generate true`: the module keeps a KV cache for sx2torch.runtime.generate; a name:
    # the argument of forward that grows (an encoder-decoder's decoder ids), else the first
    generate: Union[bool, str] = False
    keys: dict = field(default_factory=dict)  # key -> its datum, for later diagnostics
    # a row-parallel layer's reduction under tensor parallelism (LANGUAGE.md): "f32"
    # partial sums rounded once, or "bf16", the partial products rounded and summed in bf16
    tp_reduce: str = "f32"


@dataclass
class Program:
    top: Model
    models: dict  # sub-models by name, in source order
    runs: list

    def model(self, name: str) -> Model:
        return self.top if name == self.top.name else self.models[name]

    def submodel(self, model: Model, target: str, item: Optional[int] = None) -> str:
        """The model whose forward a SUBMODEL node of `model` runs: the instance's, the
        stack's, or a list's or a choice's item `item`."""
        return self.instance(model, target, item).model

    def instance(self, model: Model, target: str, item: Optional[int] = None) -> Init:
        """The initializer of the instance a SUBMODEL node of `model` runs."""
        init = model.params[target].init
        return init if item is None else init.items[item]

    def all_models(self) -> list:
        return list(self.models.values()) + [self.top]

    def member(self, model: Model, name: str) -> Optional[list]:
        """The parameter `name` reads in `model`, `a.b.weight` at any depth: [(model, "a"),
        (a's model, "b"), (b's model, "weight")], each step but the last a sub-model
        instance (not a stack); None where it names no parameter."""
        steps = []
        *subs, last = name.split(".")
        for part in subs:
            param = model.params.get(part)
            if not (param and param.init.kind == "model"):
                return None
            steps.append((model, part))
            model = self.models[param.init.model]
        param = model.params.get(last)
        if param is None or param.is_module:
            return None
        return steps + [(model, last)]
