"""The op registry: one entry per op holds its signature, torch emission,
derivative rule and precision marks.

Argument kinds (positional `args` and `keys`):
  tensor      a tensor or a scalar
  matrix      a float tensor, never a scalar (a matmul operand)
  ids         an integer tensor (indices, labels)
  like        a tensor read only for its shape: it decides no dtype and is never cast
  tensors     a vector of tensors, e.g. `[x y]`
  int         a compile-time integer
  number      a compile-time number
  bool        a compile-time boolean
  ints        a vector of compile-time integers, e.g. `[0 (* 2 d)]`
  out         :f32 (the f32-out matmul)
  reduction   :mean, :sum or :none (cross-entropy's)

`result` says what the op produces: "float" (computes in the policy's dtype),
"bool" (compares in that dtype), "keep" (moves data: integer and boolean
tensors pass through, floats follow the policy) or "arith" (like "keep", and
compile-time scalars fold).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from sx2torch.ops.rank import RankRule


@dataclass(frozen=True)
class Arg:
    name: str
    kind: str = "tensor"
    static: bool = False  # decides the result's rank or layout: written as a literal


@dataclass(frozen=True)
class Key:
    name: str
    kind: str
    default: object = None
    static: bool = False


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple
    emit: Optional[Callable] = None
    keys: tuple = ()
    result: str = "float"
    arity: Optional[tuple] = (
        None  # (least, most) arguments, most None for "any"; default: exactly args
    )
    sensitive: bool = False  # library mark (6.8): an f32 island wherever it is called
    expand: Optional[Callable] = None  # defined by other ops, traced in their place
    grad: Optional[Callable] = None
    name_inputs: bool = (
        False  # the emission reads an input twice, so it must be a local
    )
    rank: Optional[RankRule] = (
        None  # the output's shape from the inputs' (sx2torch/ops/rank.py)
    )
    folds: bool = (
        False  # n-ary in source, folded left into binary nodes: (+ a b c) is (+ (+ a b) c)
    )
    exact: bool = (
        False  # bf16 inputs give bf16 values: held-in-f32 targets need not round the output
    )
    doc: str = ""
    # made by the compiler (a derivative rule, a definition); from source, an unknown op
    internal: bool = False

    @property
    def word(self) -> str:
        """The op in identifiers: `rms_norm`, and `add` for `+`."""
        return WORDS.get(self.name) or self.name.replace("-", "_")

    @property
    def bounds(self) -> tuple:
        return self.arity or (len(self.args), len(self.args))

    def key(self, name: str) -> Optional[Key]:
        return next((k for k in self.keys if k.name == name), None)


REGISTRY: dict[str, Op] = {}
SYMBOLIC = type("Symbolic", (), {"__repr__": lambda self: "SYMBOLIC"})()
WORDS = {
    "+": "add",
    "-": "sub",
    "*": "mul",
    "/": "div",
    "//": "floordiv",
    "<": "lt",
    "<=": "le",
    ">": "gt",
    ">=": "ge",
    "=": "eq",
}

# A derivative rule `grad(t, node, g)` sees the forward node (its inputs, attrs and output) and
# the gradient `g` of its output, and returns one gradient (or None) per input, built with the
# tracer `t` as other ops: `t.op("*", [g, x])`. See sx2torch/gradient.py.


def register(op: Op) -> Op:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name!r} registered twice")
    if (op.emit is None) == (op.expand is None):
        raise ValueError(f"op {op.name!r} needs exactly one of emit and expand")
    if op.rank is None:
        raise ValueError(f"op {op.name!r} needs a rank rule")
    REGISTRY[op.name] = op
    return op


@dataclass
class EmitContext:
    """What an op's emission may depend on besides its operands."""

    target: str  # "cuda", "metal" or "cpu"
    compute: Optional[str] = None
    attrs: dict = field(default_factory=dict)  # as Python expressions
    # as compile-time values where the source wrote literals; SYMBOLIC where a const or a
    # &key argument takes part, since the caller can change it
    values: dict = field(default_factory=dict)
    scalars: (
        tuple
    ) = ()  # for each operand, whether it is a compile-time number rather than a tensor

    @property
    def tensor_dtype(self) -> str:
        """The torch dtype a new tensor of the compute dtype has: metal and cpu hold bf16 in f32."""
        return (
            "torch.bfloat16"
            if self.compute == "bf16" and self.target == "cuda"
            else "torch.float32"
        )


# Importing the op modules registers their ops.
from sx2torch.ops import adjoint, construct, elementwise, fused  # noqa: E402,F401
from sx2torch.ops import linalg, nn, optim  # noqa: E402,F401
from sx2torch.ops import reduce, scan, shape  # noqa: E402,F401
