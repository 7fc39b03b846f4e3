"""The op registry: one entry per op holds its signature, torch emission,
derivative rule and precision marks. The op modules beside it register their entries.

Argument kinds (positional `args` and `keys`) are an `ArgKind`, and what an op produces a
`Result`; an entry may write either as its string, which registration checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Optional, Union

from sx2torch.ops.rank import RankRule, known


class ArgKind(str, Enum):
    TENSOR = "tensor"  # a tensor or a scalar
    # a float tensor, never a number: a matmul's operand, a kernel's weight or bias (torch's
    # F.linear, F.layer_norm and F.conv2d take no number there)
    MATRIX = "matrix"
    IDS = "ids"  # an integer tensor (indices, labels)
    BOOL_TENSOR = "bool-tensor"  # a boolean tensor (where's condition)
    # a boolean tensor (True keeps) or an additive float one (attention's)
    MASK = "mask"
    # a tensor read only for its shape: it decides no dtype, is never cast
    LIKE = "like"
    # a tensor read in the dtype it has, decides no dtype, is never cast (a router's f32
    # weights beside bf16 activations, as transformers multiplies them)
    AS_IS = "as-is"
    TENSORS = "tensors"  # a vector of tensors, e.g. `[x y]`
    INT = "int"  # a compile-time integer
    # a compile-time integer or a const whose default is `none`: a row of a table, torch's
    # padding_idx (None, as torch takes it, where the caller leaves the const at none)
    ROW = "row"
    NUMBER = "number"  # a compile-time number
    BOOL = "bool"  # a compile-time boolean
    INTS = "ints"  # a vector of compile-time integers, e.g. `[0 (* 2 d)]`
    # as INTS, its first element may be `...`: the input's axes but the last, as they are
    # (a reshape's `[... 2 -1]`, `x.reshape(*x.shape[:-1], 2, -1)`)
    SHAPE = "shape"
    SIZES = (
        "sizes"  # an integer or a vector of them (a convolution's stride: 2 or [2 1])
    )
    PADDING = "padding"  # as SIZES, or :same or :valid (a convolution's padding)
    OUT = "out"  # :f32 (the f32-out matmul)
    REDUCTION = "reduction"  # :mean, :sum or :none (cross-entropy's)
    APPROXIMATE = "approximate"  # :none or :tanh (gelu's)
    MODE = "mode"  # :nearest or :bilinear (interpolate's)
    KERNEL_DTYPE = "kernel-dtype"  # :f32 or :input (softmax's :dtype)
    EQUATION = "equation"  # a string, einsum's "ij,jk->ik"
    TEXT = "text"  # a string the compiler writes into a message (a form as the source has it)

    @property
    def is_tensor(self) -> bool:
        """One tensor input of the node."""
        return self in TENSOR_KINDS

    @property
    def takes_bool(self) -> bool:
        """A boolean tensor may be passed here: an argument that reaches it is taken as
        its caller passes it, never cast to a float (a 0/1 float mask is an additive one).
        """
        return self in (ArgKind.BOOL_TENSOR, ArgKind.MASK)


TENSOR_KINDS = frozenset(
    {
        ArgKind.TENSOR,
        ArgKind.MATRIX,
        ArgKind.IDS,
        ArgKind.BOOL_TENSOR,
        ArgKind.LIKE,
        ArgKind.AS_IS,
        ArgKind.MASK,
    }
)
UNCAST = frozenset({ArgKind.LIKE, ArgKind.AS_IS})  # the kinds the policy never casts


class Result(str, Enum):
    FLOAT = "float"  # computes in the policy's dtype
    BOOL = "bool"  # compares in that dtype
    KEEP = "keep"  # moves data: integer and boolean tensors pass through, floats follow
    INT = "int"  # an integer tensor (int64), whatever the policy: positions, sizes
    # adds up: floats compute in the policy's dtype, integer and boolean tensors give int64
    # (never rounded), as torch's sum and cumsum do
    SUM = "sum"
    RUN = "run"  # computes in the run's precision whatever its inputs (under the marks)


@dataclass(frozen=True)
class Arg:
    name: str
    kind: ArgKind = ArgKind.TENSOR
    static: bool = False  # decides the result's rank or layout: written as a literal
    # the operand's name says what it is (cross-entropy's `logits`): a temporary made for
    # this operand alone is named after it (sx2torch/emit/naming.py)
    names: bool = False

    def __post_init__(self):
        object.__setattr__(self, "kind", ArgKind(self.kind))


@dataclass(frozen=True)
class Key:
    name: str
    kind: ArgKind
    default: object = None
    static: bool = False

    def __post_init__(self):
        object.__setattr__(self, "kind", ArgKind(self.kind))


@dataclass(frozen=True, eq=False)
class Op:
    """One op's entry. A graph's OP node holds its entry (`node.op`), so a pass reads the
    op's fields, never its name: an entry is equal only to itself, and comparing one with
    a string is an error, not False (`node.op.name` is the name, for messages)."""

    name: str
    args: tuple
    emit: Optional[Callable] = None
    keys: tuple = ()
    result: Result = Result.FLOAT
    # (least, most) arguments, most None for "any"; default: exactly args
    arity: Optional[tuple] = None
    # library mark (6.8): an f32 island wherever it is called; True, or a test of the
    # attrs (softmax's :dtype :input is torch's kernel on X as it is)
    sensitive: Union[bool, Callable] = False
    expand: Optional[Callable] = None  # defined by other ops, traced in their place
    grad: Optional[Callable] = None
    # why it has no derivative rule, where it has neither a rule nor a definition (an op the
    # compiler makes, `internal`, needs no reason: only a derivative rule makes one)
    no_grad: str = ""
    # the emission reads an input twice, so it must be a local: True, or a test of the node
    name_inputs: Union[bool, Callable] = False
    # the output's shape from the inputs' (sx2torch/ops/rank.py)
    rank: Optional[RankRule] = None
    # n-ary in source, folded left into binary nodes: (+ a b c) is (+ (+ a b) c)
    folds: bool = False
    # bf16 inputs give bf16 values, so held-in-f32 targets need not round the output: True,
    # or a test of the operands (a product with a power of two)
    exact: Union[bool, Callable] = False
    # a negation, True or a test of the operands: round(-x) is -round(x), so the policy may
    # cast its operand down instead of its result
    negation: Union[bool, Callable] = False
    doc: str = ""
    # made by the compiler (a derivative rule, a definition); from source, an unknown op
    internal: bool = False
    # what computing it in bf16 costs, for explain's warning (after the op's form)
    bf16_risk: str = ""
    # draws from torch's generator (dropout, randn-like): computing it again draws anew
    draws: bool = False
    # its value is X's elements at INDEX along :axis (gather)
    picks: bool = False
    # indices of X's elements along :axis whose call gives those elements too (topk's
    # `.indices`, whose `.values` a gather of X at them reads: sx2torch/plan/layout.py)
    picked: bool = False
    # its code calls what autocast runs in lower precision (a GEMM: matmul, linear,
    # attention, a convolution): an f32 island around it keeps autocast disabled, which
    # around other ops changes nothing, their inputs being f32 (sx2torch/plan/layout.py)
    autocasts: bool = False
    # reads the module's state (dropout's `self.training`): only a method computes it, so
    # a defun with it is never a module-level function (sx2torch/plan/functions.py)
    module_state: bool = False
    # emitted as `torch.ones_like(x, dtype=...)` (or zeros): a cast of it is the same fill
    # made in the dtype wanted (sx2torch/plan/targets.py)
    fills: bool = False
    # its value is ones or zeros, which either dtype holds: the policy makes it in the dtype
    # its readers read it in (a gradient's seed)
    constant: bool = False
    # the number that, as either operand of two, makes the op its other operand (1 for
    # `*`): the derivative rules multiply by the forward's numbers, and a product by 1 is
    # written as the other factor (sx2torch/gradient/writer.py)
    identity: Optional[int] = None
    # its value is ones of its input's shape (ones-like): a sum's backward that spreads it
    # to a wider shape makes ones of that shape instead
    ones: bool = False
    # `spread(inputs, attrs)`: where its first operand is ones of their shape, (the fill
    # it then is, the operand whose shape that fill takes), else None: the backward of a
    # sum, a full mean or a concat then reads no value computed only for its shape
    spread: Optional[Callable] = None
    # `ones_from(inputs, shape)`: (the op, its inputs) making ones of its output's shape
    # from its operands without computing it, else None; `shape(value)` is a value's shape
    # where the rank rules know it (a gradient's seed of ones)
    ones_from: Optional[Callable] = None
    # a test of the attrs: it adds up every element of its input, so its gradient is ones
    # of the input's shape, seeded without computing it
    total: Union[bool, Callable] = False
    # gives its input once a check of it has run in the module (Y's 0-d check): a value
    # made from it for its shape alone must still read it, so that the check runs
    checks: bool = False
    # gathers rows of its first input by ids (an embedding lookup): a parameter it reads is
    # cast after the gather, the rows read rather than the table (sx2torch/plan/casts.py)
    gathers: bool = False
    # gives a Python number when the module runs (`x.shape[1]`), which torch takes where it
    # takes a compile-time number: `torch.clamp(x, min=n)`, not `torch.maximum(x, n)`
    python_number: bool = False
    # the op on compile-time numbers, `numbers(operands, span, **attrs) -> Scalar`: where
    # every operand is one, it is folded when the file compiles and makes no node
    numbers: Optional[Callable] = None
    # on a literal, its value is written as the source spells it (a function of
    # syntax/scalars.py's WRITTEN: `math.sqrt(2.0 / 3.0)`, not the number it folds to)
    spells: bool = False
    # Python's own operator on numbers: where its operands are numbers some of which are
    # known only when the module runs (`size`'s), it is their arithmetic as Python writes
    # it, `(- (size x :axis 1) 1)` being `x.shape[1] - 1` (a ScalarOp.RUN scalar, usable
    # where torch takes an int), never a tensor, rounded nowhere, without a derivative
    python_arithmetic: bool = False
    # the output dtype its keys choose over the policy's, `out_dtype(attrs)`, None where the
    # policy decides: the f32-out matmul's `:out :f32`
    out_dtype: Optional[Callable] = None
    # its value is its operand's in another dtype (cast-run): a temporary is named as the
    # operand would be, `cos_emb = torch.cos(emb).to(torch.bfloat16)`
    converts: bool = False
    # combines values along an axis (a reduction, a softmax, a scan): True, or a test of the
    # attrs (`along`); a :generate run refuses one whose axis may be the sequence's, which a
    # cached step sees one position of (sx2torch/cache.py)
    mixes: Union[bool, Callable] = False
    # what a :generate run makes of it (sx2torch/cache.py): `cached(seen)`, `seen` its
    # attrs, its operands' shapes with the sequence's axis marked and whether each is made
    # from the input (sx2torch/ops/sequence.py's `Seen`), gives (the op that keeps or reads
    # the cache, its attrs; its own where it mixes no positions), or a string saying why the
    # cache cannot hold it (a diagnostic at its form), or None where the pass's checks decide
    cached: Optional[Callable] = None
    # `sequence(seen, dims)`: its output's shape in the cache pass where it keeps the
    # sequence's axis in a way its rank rule cannot see (a slice to the sequence's length)
    sequence: Optional[Callable] = None
    # keeps keys and values in the generation's cache (cached-attention)
    caches: bool = False
    # keeps a recurrent state in the generation's cache, of one size at every length (a
    # convolution's last inputs, a scan's last value): no bytes per token
    state: bool = False
    # how a value split across devices along one axis passes through it, for tensor
    # parallelism (sx2torch/ops/sharding.py); None: it needs the whole value
    shards: Optional[Callable] = None

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            raise TypeError(
                f"op {self.name!r} compared with the string {other!r}: test a field of "
                "its entry (or compare `.name` in a message's test)"
            )
        return self is other

    __hash__ = object.__hash__

    def __post_init__(self):
        # its arguments' kinds, which the passes read per operand of every node (`kinds`)
        object.__setattr__(self, "arg_kinds", tuple(arg.kind for arg in self.args))

    def __repr__(self) -> str:
        return f"<op {self.name}>"

    def kinds(self, count: int) -> tuple:
        """The kinds of its first `count` operands, the last argument's repeated (a
        variadic op's)."""
        kinds = self.arg_kinds
        if count <= len(kinds):
            return kinds[:count]
        return kinds + kinds[-1:] * (count - len(kinds))

    def is_sensitive(self, attrs: dict) -> bool:
        return self.sensitive(attrs) if callable(self.sensitive) else self.sensitive

    def negates(self, operands: tuple) -> bool:
        return self.negation(operands) if callable(self.negation) else self.negation

    def totals(self, attrs: dict) -> bool:
        return self.total(attrs) if callable(self.total) else self.total

    def is_exact(self, operands: tuple) -> bool:
        return self.exact(operands) if callable(self.exact) else self.exact

    def mixes_along(self, attrs: dict) -> bool:
        return self.mixes(attrs) if callable(self.mixes) else self.mixes

    def names_inputs(self, node) -> bool:
        return (
            self.name_inputs(node) if callable(self.name_inputs) else self.name_inputs
        )

    @property
    def word(self) -> str:
        """The op in identifiers: `rms_norm`, and `add` for `+`."""
        return WORDS.get(self.name) or self.name.replace("-", "_")

    @property
    def bounds(self) -> tuple:
        return self.arity or (len(self.args), len(self.args))

    def key(self, name: str) -> Optional[Key]:
        return next((k for k in self.keys if k.name == name), None)


def along(key: str) -> Callable:
    """A `mixes` test: the op combines along the axes its `key` gives (every axis where it
    gives none); any but the last may be the sequence's."""

    def test(attrs: dict) -> bool:
        axes = attrs.get(key)
        if axes is None:
            return True
        return any(
            known(a) != -1 for a in (axes if isinstance(axes, tuple) else (axes,))
        )

    return test


class Registry(dict):
    """The entries by name. A lookup by an entry gives the entry (registered under its
    name): code that still looks `node.op` up, as when `node.op` was a name, runs as it did.
    """

    def __getitem__(self, key) -> Op:
        return super().__getitem__(key.name if isinstance(key, Op) else key)

    def get(self, key, default=None):
        return super().get(key.name if isinstance(key, Op) else key, default)

    def __contains__(self, key) -> bool:
        return super().__contains__(key.name if isinstance(key, Op) else key)


REGISTRY: Registry = Registry()
SYMBOLIC = type("Symbolic", (), {"__repr__": lambda self: "SYMBOLIC"})()
# An op's word where its name is not what the code writes: an operator's name, and the
# method a view is written as (a temporary is named after what it is: `permute_q`).
WORDS = {
    "transpose": "permute",
    "swap-axes": "transpose",
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
# tracer `t` as other ops: `t.op("*", [g, x])`. See sx2torch/gradient/writer.py.


def register(op: Op) -> Op:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name!r} registered twice")
    if (op.emit is None) == (op.expand is None):
        raise ValueError(f"op {op.name!r} needs exactly one of emit and expand")
    if op.rank is None:
        raise ValueError(f"op {op.name!r} needs a rank rule")
    if not (op.grad or op.expand or op.no_grad or op.internal):
        raise ValueError(
            f"op {op.name!r} needs a derivative rule, a definition, or no_grad saying why"
        )
    op = replace(op, result=Result(op.result))  # an unknown result is refused here
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
    # for each operand, whether it is a compile-time number rather than a tensor
    scalars: tuple = ()
    # for each operand, its rank where the ranks pass knows it, else None
    ranks: tuple = ()

    @property
    def tensor_dtype(self) -> str:
        """The torch dtype a new tensor of the compute dtype has: metal and cpu hold bf16 in f32."""
        return (
            "torch.bfloat16"
            if self.compute == "bf16" and self.target == "cuda"
            else "torch.float32"
        )
