"""Parameter initializers, one entry each: the arguments the source gives it, the sizes of
the tensor it makes (read by the rank check, explain's sizes and the optimizer's grouping),
and the torch expression that makes it in the constructor.

`(normal [d d] :std 0.02)` is the Init("normal", {"shape": (d, d), "mean": 0, "std": 0.02})
that resolve makes of it; a composite initializer (`concat`, `repeat`, `pow`, `tensor`,
and the formulas: `arange`, `outer`, a function of one, arithmetic) has a form of its own,
which resolve reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import libcst as cst

import sx2torch.build as b
from sx2torch.syntax.scalars import Scalar, ScalarOp


@dataclass(frozen=True)
class Initializer:
    name: str
    # `emit(args, write, part)`: the torch expression, `write(scalar)` writing a number and
    # `part(init)` a part of a composite initializer
    emit: Callable
    # the arguments before the keywords (`shape` a vector of sizes, the rest numbers), and
    # the keywords' defaults; None for a composite initializer, which resolve reads
    positional: Optional[tuple] = None
    keys: Optional[dict] = None
    # the sizes of the tensor it makes, as Scalars, from its args
    sizes: Callable = lambda args: args["shape"]
    # the arguments that count elements (eye's n): compile-time integers, checked by resolve
    counts: tuple = ()
    # the arguments it computes from those given, once resolve has read them
    derived: Callable = lambda args: {}
    # the keys that name a row, which a const whose default is none may give (normal's
    # :padding-idx); every other argument is a number
    rows: tuple = ()


INITIALIZERS: dict[str, Initializer] = {}
# the functions an initializer may apply to another's values, `(log (arange 1 n))`
FORMULA_FUNCTIONS = ("log", "exp", "sin", "cos", "sqrt")
# arithmetic of initializers, `(* (arange 0 n) 2.0)`
FORMULA_ARITHMETIC = ("+", "-", "*", "/")
# the formulas' heads, which a model may have as its name too
FORMULAS = ("arange", "outer", *FORMULA_FUNCTIONS, *FORMULA_ARITHMETIC)


def register(initializer: Initializer) -> None:
    INITIALIZERS[initializer.name] = initializer


def sizes(init) -> tuple:
    """The sizes of the tensor an Init makes."""
    return INITIALIZERS[init.kind].sizes(init.args)


def emit(init, write) -> cst.BaseExpression:
    """The torch expression making an Init's tensor, each number written by `write`."""
    return INITIALIZERS[init.kind].emit(
        init.args, write, lambda part: emit(part, write)
    )


def as_float(value: Scalar, write) -> cst.BaseExpression:
    """Initializer arguments as floats, so `(normal [d] :std 1)` makes a float tensor."""
    if value.op is ScalarOp.LIT and isinstance(value.value, int):
        return b.number(float(value.value))
    return write(value)


def _shape(args, write) -> list:
    """The sizes as arguments; torch.zeros() is refused: a shape [] is 0-d, torch.zeros(())."""
    return [write(s) for s in args["shape"]] or [b.tuple_([])]


def _filled(name: str) -> Callable:
    return lambda args, write, part: b.call(f"torch.{name}", *_shape(args, write))


register(Initializer("zeros", _filled("zeros"), ("shape",), {}))
register(Initializer("ones", _filled("ones"), ("shape",), {}))
register(
    Initializer(
        "full",
        lambda args, write, part: b.call(
            "torch.full",
            b.tuple_([write(s) for s in args["shape"]]),
            as_float(args["value"], write),
        ),
        ("shape", "value"),
        {},
    )
)
register(
    Initializer(
        "normal",
        lambda args, write, part: b.call(
            "torch.normal",
            as_float(args["mean"], write),
            as_float(args["std"], write),
            size=b.tuple_([write(s) for s in args["shape"]]),
        ),
        ("shape",),
        # :padding-idx P: row P zeroed after the draw, as nn.Embedding(..., padding_idx=P)
        # and transformers' _init_weights leave it (emit/module.py writes torch's fill)
        {"mean": 0, "std": 1, "padding-idx": None},
        rows=("padding-idx",),
    )
)
# nn.Linear's and the convolutions' default weight: torch's own call (`a` is sqrt(5)
# there), so the same seed gives the same bits (its bound computed as torch computes it)
register(
    Initializer(
        "kaiming-uniform",
        lambda args, write, part: b.call(
            "nn.init.kaiming_uniform_",
            b.call("torch.empty", *_shape(args, write)),
            a=as_float(args["a"], write),
        ),
        ("shape",),
        {"a": 0},
    )
)


def _bias_bound(args) -> dict:
    """torch's `bound = 1 / math.sqrt(fan_in)` (a bias of nn.Linear and the
    convolutions), the low end written -1 / math.sqrt(fan_in), which is -bound exactly.
    """
    root = Scalar(ScalarOp.SQRT, (args["fan-in"],), math.sqrt(args["fan-in"].value))
    low, high = (
        Scalar(ScalarOp.DIV, (Scalar.lit(one), root), one / root.value)
        for one in (-1, 1)
    )
    return {"low": low, "high": high}


# nn.Linear's and the convolutions' default bias: uniform in +-1/sqrt(fan_in), drawn by
# torch's own call on the bound torch computes
register(
    Initializer(
        "fan-in-uniform",
        lambda args, write, part: b.call(
            "nn.init.uniform_",
            b.call("torch.empty", *_shape(args, write)),
            write(args["low"]),
            write(args["high"]),
        ),
        ("shape",),
        {"fan-in": 1},
        derived=_bias_bound,
    )
)
register(
    Initializer(
        "uniform",
        lambda args, write, part: b.method(
            b.call("torch.empty", *_shape(args, write)),
            "uniform_",
            as_float(args["low"], write),
            as_float(args["high"], write),
        ),
        ("shape",),
        {"low": 0, "high": 1},
    )
)
register(
    Initializer(
        "eye",
        lambda args, write, part: b.call("torch.eye", write(args["n"])),
        ("n",),
        {},
        sizes=lambda args: (args["n"], args["n"]),
        counts=("n",),
    )
)
register(
    Initializer(
        "linspace",
        lambda args, write, part: b.call(
            "torch.linspace",
            as_float(args["start"], write),
            as_float(args["end"], write),
            write(args["n"]),
        ),
        ("n",),
        {"start": 0, "end": 1},
        sizes=lambda args: (args["n"],),
        counts=("n",),
    )
)
register(
    Initializer(
        "arange",
        lambda args, write, part: b.call(
            "torch.arange",
            write(args["start"]),
            write(args["end"]),
            dtype=b.dotted("torch.float32"),
        ),
        sizes=lambda args: (args["size"],),
    )
)


def _concat(args, write, part) -> cst.BaseExpression:
    parts = b.list_([part(p) for p in args["parts"]])
    if args["axis"] == 0:
        return b.call("torch.cat", parts)
    return b.call("torch.cat", parts, dim=b.number(args["axis"]))


register(Initializer("concat", _concat))
# A formula of initializers (sinusoidal tables, Mamba's A_log): a function of one, applied
# to each value, and arithmetic of two or of one and a number, as the torch calls.
for _name in FORMULA_FUNCTIONS:
    register(
        Initializer(
            _name,
            lambda args, write, part, name=_name: b.call(
                f"torch.{name}", part(args["part"])
            ),
        )
    )


def _operand(value, write, part) -> cst.BaseExpression:
    return as_float(value, write) if isinstance(value, Scalar) else part(value)


register(
    Initializer(
        "arithmetic",
        lambda args, write, part: b.binop(
            _operand(args["left"], write, part),
            args["op"],
            _operand(args["right"], write, part),
        ),
    )
)
register(
    Initializer(
        "outer",
        lambda args, write, part: b.call(
            "torch.outer", part(args["left"]), part(args["right"])
        ),
    )
)
register(
    Initializer(
        "repeat",
        lambda args, write, part: b.method(
            part(args["part"]), "repeat", write(args["count"])
        ),
    )
)
register(
    Initializer(
        "pow",
        lambda args, write, part: b.binop(
            as_float(args["base"], write), "**", part(args["part"])
        ),
    )
)
register(
    Initializer(
        "tensor",
        lambda args, write, part: b.call(
            "torch.tensor", b.list_([as_float(v, write) for v in args["values"]])
        ),
    )
)
