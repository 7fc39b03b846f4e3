"""Evaluation of a defun's forms on tensors, each value given the dtype the rules give.

The rules (docs/LANGUAGE.md, "Precision"): under `:bf16` a value stays f32 until it meets a
parameter or a bf16 value; trained parameters are f32 masters read in the dtype of the op
that reads them; `:numerics :high` readers compute in f32; an island computes in f32 and a
region in bf16 under either policy, the innermost winning, and a defun called inside one
computes as it says; library marks are islands; a 0-d value (an element `(at v i)`, a full
reduction, a parameter of shape [], an elementwise op on such) decides no dtype beside a
tensor with axes (torch's type promotion). Nothing here reads the compiler's
trace, policy or emission: this is the oracle they are checked against.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import Optional

import torch

import sx2torch.interpret.ops as ops
from sx2torch.interpret.model import Instance, ParamValue, Sequential, stand_in
from sx2torch.interpret.tape import Node
from sx2torch.syntax.read import Boolean, Keyword, Number, String, Symbol, Vector
from sx2torch.syntax.scalars import FUNCTIONS

F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64
DTYPES = {":f32": F32, ":bf16": BF16}
ISLAND, REGION = "island", "region"
COMPILE_TIME = {
    "+": lambda a: sum(a[1:], a[0]),
    "-": lambda a: -a[0] if len(a) == 1 else functools.reduce(operator.sub, a),
    "*": lambda a: math.prod(a[1:], start=a[0]),
    "/": lambda a: a[0] / a[1],
    "//": lambda a: a[0] // a[1],
    "mod": lambda a: a[0] % a[1],
    "**": lambda a: a[0] ** a[1],
    "pow": lambda a: a[0] ** a[1],
    "sqrt": lambda a: a[0] ** 0.5,  # as the module writes a const's root
    "=": lambda a: a[0] == a[1],
    "<": lambda a: a[0] < a[1],
    "<=": lambda a: a[0] <= a[1],
    ">": lambda a: a[0] > a[1],
    ">=": lambda a: a[0] >= a[1],
    "and": all,
    "or": any,
    "not": lambda a: not a[0],
    "in": lambda a: a[0] in a[1],
}


# The special forms, and the ops the library defines by other ops: forms.py fills them.
FORMS: dict = {}
DEFINED: dict = {}


# ops whose 0-d result (a full reduction) is 0-d by rank whatever their inputs are
ZERO_D_MAKERS = frozenset(
    {"sum", "mean", "amax", "amin", "scalar-like", "cross-entropy"}
)


# The span of the innermost form whose evaluation raised an error of torch's (a shape the
# entry point's arguments do not fit), set on the error.
FAILED_AT = "sx_failed_at"
# What torch, and the checks the module makes when it runs, raise on values that do not fit.
FAILURES = (RuntimeError, IndexError, ValueError)


class EvalError(Exception):
    """A program the interpreter cannot evaluate (a form or an op it does not know)."""


class NotMade(EvalError, ValueError):
    """A read of a parameter this instance does not make (its `:when` is false): an `if`
    branch not taken may hold one; a read evaluated fails as the module's does."""


@dataclass(frozen=True)
class Lam:
    """A 0-d element `(at v i)`: it decides no dtype beside tensors with axes."""

    t: torch.Tensor


@dataclass(frozen=True)
class Frame:
    instance: Instance
    env: dict
    mode: Optional[str] = None  # ISLAND, REGION or None (the policy)
    outer: tuple = ()  # the modes of the forms around, outermost first

    def bind(self, names: dict) -> "Frame":
        return Frame(self.instance, {**self.env, **names}, self.mode, self.outer)

    def within(self, mode: Optional[str]) -> "Frame":
        if mode == self.mode:
            return self
        return Frame(self.instance, self.env, mode, self.marks)

    @property
    def marks(self) -> tuple:
        """The modes of every form around, outermost first, this frame's own last."""
        return self.outer + (self.mode,)


def is_float(v) -> bool:
    if isinstance(v, Lam):
        return True
    if isinstance(v, ParamValue):
        return True
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def zero_d(v) -> bool:
    """0-d by rank: an element, a full reduction, or a parameter of shape []."""
    return isinstance(v, Lam) or isinstance(v, ParamValue) and v.tensor.dim() == 0


def dtype_of(v):
    if isinstance(v, Lam):
        return v.t.dtype
    if isinstance(v, ParamValue):
        return v.joined or v.tensor.dtype
    return v.dtype if isinstance(v, torch.Tensor) else None


def leaf(v):
    """A float tensor without history as a leaf that autograd can differentiate to."""
    if (
        isinstance(v, torch.Tensor)
        and v.is_floating_point()
        and not v.requires_grad
        and torch.is_grad_enabled()
    ):
        return keep_rank(v, v.detach().requires_grad_())
    return v


# A tensor whose rank is not known when the file compiles (it depends on an entry point's
# argument) has this attribute: it is treated as having axes, as the compiler does, even
# where it is 0-d when it runs.
UNRANKED = "sx_unranked"


def unranked(v) -> bool:
    return isinstance(v, torch.Tensor) and getattr(v, UNRANKED, False)


def without_rank(v):
    """An entry point's argument: a view of it whose rank is not known."""
    if not isinstance(v, torch.Tensor):
        return v
    view = v.view_as(v)
    _mark(view)
    return view


def keep_rank(old, new):
    """`new`, made from `old`, has a rank not known where `old`'s is not."""
    if unranked(old):
        _mark(new)
    return new


def _mark(v) -> None:
    if isinstance(v, torch.Tensor):
        setattr(v, UNRANKED, True)


def _apply(ev: "Evaluator", spec, name: str, cast: list, keys: dict, dtype):
    """The op on its operands cast to `dtype`: a matmul's :out :f32 product wide, a bf16
    function in f32 where `ev.rounded_once` (Evaluator.op rounds it), else torch's kernel.
    """
    if name == "matmul" and keys.get("out") == ":f32":
        wide = F64 if ev.precision == "f64" else F32
        return cast[0].to(wide) @ cast[1].to(wide)
    if spec.training:
        return spec.fn(cast, {**keys, "training": ev.training})
    if ev.rounded_once and name in ops.FUNCTIONS and dtype == BF16:
        return spec.fn([c.float() for c in cast], keys)
    return spec.fn(cast, keys)


class Evaluator:
    def __init__(
        self,
        top: Instance,
        precision: str,
        training: bool = True,
        rounded_once=False,
    ):
        self.top = top
        self.precision = precision
        self.training = training
        self.rounded_once = rounded_once  # bf16 functions: f32, then one rounding
        # > 0 inside an `if`'s branch not taken, evaluated for its dtype alone
        self.untaken = 0
        self.tape: list = []  # every op computed, as gradient differentiates it

    # Dtypes.

    def decide(self, values: list, mode: Optional[str], run: bool = False):
        """The dtype an op reading `values` computes in; None: torch's promotion of 0-d.
        `run`: the run's precision whatever `values` are (cast-run)."""
        floats = [v for v in values if is_float(v)]
        if (
            self.precision == "f64"
        ):  # every rule's dtype widened: is f32 arithmetic exact?
            return F64
        # 0-d values decide no dtype beside tensors with axes; between themselves they
        # decide as two tensors do (an f32 sum and a bf16 element: bf16)
        among = _among_themselves(floats)
        deciding = [v for v in floats if among or not zero_d(v)]
        if mode == ISLAND:
            return F32
        if any(isinstance(v, ParamValue) and v.high for v in deciding):
            return F32
        if mode == REGION:
            return BF16
        if self.precision == "f32":
            return F32
        if run:
            return BF16
        if any(isinstance(v, ParamValue) or dtype_of(v) == BF16 for v in deciding):
            return BF16
        return None if among else F32

    def join(self, a, b):
        """Two dtypes of one value, as an op reading both computes outside any form."""
        if a is None or a == b:
            return b
        if b is None:
            return a
        return {"bf16": BF16, "f32": F32}.get(self.precision, F64)

    def cast(self, v, dtype):
        """`v` read in `dtype` (None: as it is)."""
        if isinstance(v, Lam):  # beside a tensor with axes: read in the op's dtype too
            wanted = dtype is not None and v.t.is_floating_point()
            return keep_rank(v.t, v.t.to(dtype)) if wanted else v.t
        if isinstance(v, ParamValue):
            return v.read(dtype or v.tensor.dtype)
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v if dtype is None or v.dtype == dtype else keep_rank(v, v.to(dtype))
        return v

    def alias(self, source, value, frame: "Frame"):
        """`value`, a cast of `source` the rules insert (an `if`'s or a loop's join, a
        `cast` form): its backward passes the gradient on as it is."""
        if tensor_of(value) is not tensor_of(source):
            self.tape.append(Node("alias", [source], {}, frame, False, value))
        return value

    # Calls.

    def enter(self, name: str, args: list, keys: dict, down: tuple = ()):
        """A call of `self.top`'s public `name` from outside, its float arguments at the
        indices `down` cast down at entry (Interpreted.entry); None, booleans and
        integers pass as they are, as the module's cast passes them."""
        dtype = F64 if self.precision == "f64" else BF16
        for index in down:
            if index < len(args) and is_float(args[index]):  # (call checks the arity)
                args[index] = keep_rank(args[index], args[index].to(dtype))
        return self.call(self.top, name, args, keys, None)

    def call(self, instance: Instance, name: str, args: list, keys: dict, around):
        """A call made in the frame `around`, whose marks the callee computes in (None:
        from outside, under the policy)."""
        defun = instance.model.defuns.get(name)
        if defun is None:
            raise EvalError(f"model '{instance.model.name}' has no defun '{name}'")
        if len(args) != len(defun.args):
            raise EvalError(f"'{name}' takes {len(defun.args)} arguments")
        around = around or Frame(instance, {})  # called from outside: the policy
        frame = Frame(instance, {}, around.mode, around.outer)
        env = {a.name: leaf(v) for a, v in zip(defun.args, args)}
        for symbol, default in defun.keys:
            given = symbol.name in keys
            value = keys[symbol.name] if given else self.eval(default, frame.bind(env))
            env[symbol.name] = leaf(value)
        unknown = set(keys) - {s.name for s, _ in defun.keys}
        if unknown:
            raise EvalError(f"'{name}' has no key {sorted(unknown)}")
        value = self.body(defun.body, frame.bind(env))
        if isinstance(value, ParamValue) and value.joined:  # an `if` of parameter reads
            return self.alias(value, self.cast(value, value.joined), frame)
        return value

    def body(self, forms, frame: Frame):
        value = None
        for form in forms:
            value = self.eval(form, frame)
        return value

    # Expressions.

    def eval(self, d, frame: Frame):
        if isinstance(d, (Number, Boolean)):
            return d.value
        if isinstance(d, Keyword):
            return ":" + d.name
        if isinstance(d, String):  # einsum's equation (a docstring is read by resolve)
            return d.value
        if isinstance(d, Vector):
            return [self.eval(item, frame) for item in d.items]
        if isinstance(d, Symbol):
            return self.lookup(d.name, frame)
        if not d.items or not isinstance(d.items[0], Symbol):
            raise EvalError("a call needs an op or function name")
        try:
            return self.form(d.items[0].name, d.items[1:], frame)
        except FAILURES as error:  # torch's, on the values given
            if not hasattr(error, FAILED_AT):  # the innermost form is where it failed
                setattr(error, FAILED_AT, d.span)
            raise

    def form(self, head: str, items: list, frame: Frame):
        form = FORMS.get(head)
        if form:
            return form(self, items, frame)
        args, keys = self.arguments(items, frame)
        return self.apply_call(head, args, keys, frame)

    def arguments(self, items, frame: Frame) -> tuple:
        args, keys, i = [], {}, 0
        while i < len(items):
            if isinstance(items[i], Keyword):
                keys[items[i].name] = self.eval(items[i + 1], frame)
                i += 2
            else:
                args.append(self.eval(items[i], frame))
                i += 1
        return args, keys

    def lookup(self, name: str, frame: Frame):
        if name in frame.env:
            return frame.env[name]
        instance = frame.instance
        if name in instance.env:
            return instance.env[name]
        if name in instance.params:
            return instance.params[name]
        if name == "none":
            return None
        if name == "...":  # a reshape's first size (the compiler allows it only there)
            return Ellipsis
        param = instance.model.params.get(name)
        if param is not None and self.untaken:
            return stand_in(instance, param)
        if param is not None:  # as the module's self.gate raises, when run
            raise NotMade(f"parameter '{name}' is not made here: its :when is false")
        if "." in name:  # a sub-model's parameter, at any depth
            value = instance
            for part in name.split("."):
                value = value.params.get(part) if isinstance(value, Instance) else None
            if isinstance(value, ParamValue):
                return value
        raise EvalError(f"unknown name '{name}'")

    def apply_call(self, head: str, args: list, keys: dict, frame: Frame):
        values = args + list(keys.values())
        if head in COMPILE_TIME and not any(
            isinstance(v, (torch.Tensor, Lam, ParamValue)) for v in values
        ):
            return COMPILE_TIME[head](args)
        if head in FUNCTIONS and args and all(type(v) in (int, float) for v in args):
            return FUNCTIONS[head](args[0])  # `(log 2.0)`: in f64, as Python's math
        if head == "**":  # on a tensor, as on numbers, the power op
            head = "pow"
        instance = frame.instance
        if head in instance.model.defuns:
            return self.call(instance, head, args, keys, frame)
        callee = frame.env.get(head, instance.params.get(head))
        if callee is None and head in instance.model.params:
            callee = self.lookup(head, frame)  # a sub-model not made here
        if isinstance(callee, Instance):
            return self.call(callee, "forward", args, keys, frame)
        if isinstance(callee, Sequential):
            return _sequential(self, callee, args, frame)
        if head in DEFINED:
            return DEFINED[head](self, args, keys, frame)
        if head in ("+", "-", "*") and len(args) > 2:  # folded left, each its own dtype
            return self.apply_call(
                head, [self.op(head, args[:2], {}, frame), *args[2:]], keys, frame
            )
        if head in ops.OPS:
            return self.op(head, args, keys, frame)
        raise EvalError(f"unknown op or function '{head}'")

    def op(self, name: str, args: list, keys: dict, frame: Frame):
        spec = ops.OPS[name]
        kind = spec.kind_of(keys)
        mode = ISLAND if kind == ops.ISLAND else frame.mode
        given = list(args)
        parts = list(args[0]) + args[1:] if spec.lists else args
        unskipped = [v for i, v in enumerate(args) if i not in spec.skip]
        deciding = parts if spec.lists else unskipped
        dtype = self.decide(deciding, mode, run=kind == ops.RUN)
        if kind == ops.KEEP and not any(is_float(v) for v in deciding):
            dtype = None
        elif dtype is None and not any(is_float(v) for v in deciding):
            dtype = BF16 if mode == REGION else F32
        # 0-d among themselves: read in the dtype they decide, as tensors are; else a
        # 0-d parameter is read as an element is
        among = _among_themselves([v for v in deciding if is_float(v)])
        read = _unlam if among else _as_lam
        args = [read(v) for v in args]
        if spec.lists:
            args[0] = [read(v) for v in args[0]]
        cast = [
            tensor_of(v) if i in spec.skip else self.cast(v, dtype)
            for i, v in enumerate(args)
        ]
        if spec.lists:
            cast[0] = [self.cast(v, dtype) for v in args[0]]
        result = _apply(self, spec, name, cast, keys, dtype)
        if (
            kind in (ops.FLOAT, ops.ISLAND)
            and dtype is not None
            and result.dtype != torch.bool
            and not (name == "matmul" and keys.get("out") == ":f32")
        ):
            result = result.to(dtype)
        if not _fixes_rank(name, keys) and any(unranked(v) for v in parts):
            for made in result if isinstance(result, tuple) else (result,):
                _mark(made)
        value = _lam(name, parts, args, result)
        high = any(isinstance(v, ParamValue) and v.high for v in deciding)
        self.tape.append(Node(name, given, keys, frame.within(mode), high, value))
        return value


def tensor_of(v):
    """The tensor a value holds: an element's, a parameter's as stored."""
    if isinstance(v, Lam):
        return v.t
    return v.tensor if isinstance(v, ParamValue) else v


def _lam(name, parts, args, result):
    """A 0-d value, which decides no dtype beside tensors with axes: an element of a
    vector, a full reduction, a cast of one, an elementwise op on such (0-d by rank)."""
    if not isinstance(result, torch.Tensor) or result.dim() != 0 or unranked(result):
        return result
    if name == "at":
        return Lam(result) if dtype_of(args[0]) and _rank(args[0]) == 1 else result
    tensors = [v for v in parts if isinstance(v, (torch.Tensor, Lam, ParamValue))]
    if tensors and (name in ZERO_D_MAKERS or all(zero_d(v) for v in tensors)):
        return Lam(result)
    return result


def _fixes_rank(name: str, keys: dict) -> bool:
    """The op's result has a rank known whatever its inputs' ranks are."""
    if name in ("sum", "mean", "amax", "amin"):
        return keys.get("axes") is None and not keys.get("keepdims")
    return name in ("reshape", "scalar-like", "cross-entropy")


def _among_themselves(floats: list) -> bool:
    """Every float operand is 0-d: they decide between themselves as tensors do."""
    return bool(floats) and all(zero_d(v) for v in floats)


def _unlam(v):
    return v.t if isinstance(v, Lam) else v


def _as_lam(v):
    return Lam(v.tensor) if isinstance(v, ParamValue) and zero_d(v) else v


def _rank(v) -> int:
    if isinstance(v, ParamValue):
        return v.tensor.dim()
    return (v.t if isinstance(v, Lam) else v).dim()


def _sequential(ev, items, args: list, frame):
    """A sequential called: each item's forward on the value before, as torch's."""
    (value,) = args
    for item in items:
        value = ev.call(item, "forward", [value], {}, frame)
    return value
