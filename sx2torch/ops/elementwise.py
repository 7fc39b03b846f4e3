"""Elementwise ops: arithmetic, functions of one tensor, comparisons.

Each derivative rule sees the forward node `n` (inputs `n.inputs`, output `n`) and the
gradient `g` of its output; `t.sum_back` sums an operand's gradient back to its shape where
the op broadcast it.
"""

import math
from dataclasses import replace
from functools import partial

import sx2torch.build as b
from sx2torch.ir import Kind, Node, Scalar
import sx2torch.ops.sequence as sequence
from sx2torch.ops import sharding
from sx2torch.ops.registry import Arg, Key, Op, Result, register
from sx2torch.ops.conv import given
from sx2torch.ops.rank import BROADCAST, known
from sx2torch.syntax import scalars
from sx2torch.syntax.scalars import ScalarOp

X, Y = Arg("x"), Arg("y")
HALF, ONE, TWO, ZERO = (Scalar.lit(v) for v in (0.5, 1.0, 2.0, 0.0))


def _register(op: Op) -> Op:
    # in a :generate run, the positions broadcast against a fixed size are refused
    return register(
        replace(
            op,
            rank=BROADCAST,
            shards=sharding.pointwise,
            cached=op.cached or sequence.broadcast,
        )
    )


def _binary(
    name: str,
    python_op: str,
    grad,
    arity=None,
    doc="",
    exact=False,
    no_grad="",
    identity=None,
) -> None:
    def emit(a, ctx):
        return b.binop(a[0], python_op, a[1])

    _register(
        Op(
            name,
            (X, Y),
            emit,
            result="keep",
            numbers=partial(scalars.arithmetic, scalars.ARITHMETIC[name]),
            python_arithmetic=True,
            arity=arity,
            grad=grad,
            no_grad=no_grad,
            folds=arity is not None,
            exact=exact,
            identity=identity,
            doc=doc,
        )
    )


def _scales_by_a_power_of_two(operands: tuple) -> bool:
    """x * 2^k, k >= 0, written as a literal: the product keeps x's bf16 mantissa, and
    overflows exactly where bf16 does. (A k below 0 can make a subnormal that needs more
    bits than bf16 has.)"""
    for scale in operands:
        value = known(scale) if isinstance(scale, Scalar) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value:
            mantissa, exponent = math.frexp(abs(value))
            if mantissa == 0.5 and exponent >= 1:
                return True
    return False


def _zero_or_one(operand) -> bool:
    """A comparison's booleans, read as they are or cast to a float: every value 0 or 1."""
    if isinstance(operand, Node) and operand.kind is Kind.CAST:
        operand = operand.inputs[0]
    return (
        isinstance(operand, Node)
        and operand.kind is Kind.OP
        and operand.op.result == Result.BOOL
    )


def _product_is_exact(operands: tuple) -> bool:
    """x * 2^k (`_scales_by_a_power_of_two`), or x times a mask of 0s and 1s: x, or a zero
    of x's sign (a NaN where x is infinite)."""
    return _scales_by_a_power_of_two(operands) or any(map(_zero_or_one, operands))


def _add_grad(t, n, g):
    return [t.sum_back(g, n, i, passed=True) for i in range(2)]


def _multiply_grad(t, n, g):
    x, y = n.inputs
    return [
        t.sum_back(t.op("*", [g, y]), n, 0),
        t.sum_back(t.op("*", [g, x]), n, 1),
    ]


def _divide_grad(t, n, g):
    x, y = n.inputs
    dy = t.op("neg", [t.op("/", [t.op("*", [g, n]), y])])
    return [t.sum_back(t.op("/", [g, y]), n, 0), t.sum_back(dy, n, 1)]


_binary("+", "+", _add_grad, arity=(2, None), doc="n-ary sum, folded left")
_binary(
    "*",
    "*",
    _multiply_grad,
    arity=(2, None),
    doc="n-ary product, folded left; exact in bf16 when scaling by a literal 2^k, k >= 0, or "
    "by a comparison's booleans",
    exact=_product_is_exact,
    identity=1,
)
_binary("/", "/", _divide_grad)
_binary(
    "//",
    "//",
    None,
    doc="floor division (for constants, as `(// d h)`)",
    no_grad="floor division is piecewise constant",
)
_binary(
    "mod",
    "%",
    None,
    doc="the remainder of floor division, Python's `%` (torch.remainder): "
    "`(= (mod i 2) 0)` on a layer index",
    no_grad="no derivative rule yet",
)


def _minus(a, ctx):
    return b.neg(a[0]) if len(a) == 1 else b.binop(a[0], "-", a[1])


def _negates(operands: tuple) -> bool:
    return len(operands) == 1


def _minus_grad(t, n, g):
    if len(n.inputs) == 1:
        return [t.op("neg", [g])]
    return [t.sum_back(g, n, 0, passed=True), t.sum_back(t.op("neg", [g]), n, 1)]


_register(
    Op(
        "-",
        (X, Y),
        _minus,
        result="keep",
        numbers=partial(scalars.arithmetic, ScalarOp.SUB),
        python_arithmetic=True,
        arity=(1, None),
        folds=True,
        grad=_minus_grad,
        exact=_negates,
        negation=_negates,
        doc="n-ary difference, folded left: (- x a b) is (- (- x a) b); negation with one argument",
    )
)
_register(
    Op(
        "neg",
        (X,),
        lambda a, ctx: b.neg(a[0]),
        result="keep",
        numbers=partial(scalars.arithmetic, ScalarOp.NEG),
        python_arithmetic=True,
        grad=lambda t, n, g: [t.op("neg", [g])],
        exact=True,
        negation=True,
    )
)


def _times(t, g, *factors):
    """g times each factor, in turn."""
    for factor in factors:
        g = t.op("*", [g, factor])
    return g


def _one_minus(t, value):
    return t.op("-", [ONE, value])


def _compare(t, op: str, x):
    return t.op(op, [x, ZERO])


def _where(t, condition, yes, no):
    return t.op("where", [condition, yes, no])


def _gauss(t, x, scale: float):
    """exp(-x**2 / scale)."""
    return t.op("exp", [t.op("*", [Scalar.lit(-1.0 / scale), t.op("square", [x])])])


def _gelu_grad(t, n, g):
    """Exact gelu: Φ(x) + x·φ(x), Φ the standard normal CDF and φ its density."""
    x = n.inputs[0]
    cdf = t.op(
        "*",
        [
            HALF,
            t.op(
                "+", [ONE, t.op("erf", [t.op("*", [x, Scalar.lit(1 / math.sqrt(2))])])]
            ),
        ],
    )
    density = t.op("*", [Scalar.lit(1 / math.sqrt(2 * math.pi)), _gauss(t, x, 2.0)])
    return [_times(t, g, t.op("+", [cdf, t.op("*", [x, density])]))]


def _silu_grad(t, n, g):
    x = n.inputs[0]
    s = t.op("sigmoid", [x])
    return [_times(t, g, s, t.op("+", [ONE, t.op("*", [x, _one_minus(t, s)])]))]


GROWING = "computes in bf16 outside an f32 island, where its rounding errors grow"


def _function(
    name: str, torch_name: str, result: str, grad, exact=False, bf16_risk=""
) -> None:
    function = b.dotted(torch_name)  # one node for every call written (it is immutable)
    op = Op(
        name,
        (X,),
        lambda a, ctx: b.call(function, a[0]),
        result=result,
        grad=grad,
        exact=exact,
        bf16_risk=bf16_risk,
        numbers=(
            partial(scalars.function, name) if name in scalars.FUNCTIONS else None
        ),
        spells=name in scalars.WRITTEN,
    )
    _register(op)


_function(
    "exp", "torch.exp", "float", lambda t, n, g: [_times(t, g, n)], bf16_risk=GROWING
)
_function(
    "log",
    "torch.log",
    "float",
    lambda t, n, g: [t.op("/", [g, n.inputs[0]])],
    bf16_risk=GROWING,
)
_function(
    "log1p",
    "torch.log1p",
    "float",
    lambda t, n, g: [t.op("/", [g, t.op("+", [n.inputs[0], ONE])])],
    bf16_risk=GROWING,
)
_function(
    "expm1",
    "torch.expm1",
    "float",
    lambda t, n, g: [_times(t, g, t.op("+", [n, ONE]))],
    bf16_risk=GROWING,
)
_function(
    "sqrt", "torch.sqrt", "float", lambda t, n, g: [t.op("/", [g, t.op("*", [TWO, n])])]
)
_function(
    "rsqrt",
    "torch.rsqrt",
    "float",
    lambda t, n, g: [_times(t, g, Scalar.lit(-0.5), t.op("pow", [n, Scalar.lit(3)]))],
)
_function(
    "tanh",
    "torch.tanh",
    "float",
    lambda t, n, g: [_times(t, g, _one_minus(t, t.op("square", [n])))],
)
_function(
    "sigmoid",
    "torch.sigmoid",
    "float",
    lambda t, n, g: [_times(t, g, n, _one_minus(t, n))],
)
_function(
    "sin",
    "torch.sin",
    "float",
    lambda t, n, g: [_times(t, g, t.op("cos", [n.inputs[0]]))],
)
_function(
    "cos",
    "torch.cos",
    "float",
    lambda t, n, g: [t.op("neg", [_times(t, g, t.op("sin", [n.inputs[0]]))])],
)
_function(
    "erf",
    "torch.erf",
    "float",
    lambda t, n, g: [
        _times(t, g, Scalar.lit(2 / math.sqrt(math.pi)), _gauss(t, n.inputs[0], 1.0))
    ],
)
_function(
    "abs",
    "torch.abs",
    "keep",
    lambda t, n, g: [
        _where(
            t,
            _compare(t, ">", n.inputs[0]),
            g,
            _where(t, _compare(t, "<", n.inputs[0]), t.op("neg", [g]), ZERO),
        )
    ],
    exact=True,
)
_function(
    "relu",
    "torch.relu",
    "keep",
    lambda t, n, g: [_where(t, _compare(t, ">", n.inputs[0]), g, ZERO)],
    exact=True,
)
_function(
    "square",
    "torch.square",
    "keep",
    lambda t, n, g: [_times(t, g, t.op("*", [TWO, n.inputs[0]]))],
)

# floor and ceil of a bf16 number are bf16 numbers; torch's derivative is zero
for _step in ("floor", "ceil"):
    _function(_step, f"torch.{_step}", "keep", lambda t, n, g: [None], exact=True)


def _int(a, ctx):
    return b.method(a[0], "long" if ctx.values["bits"] == 64 else "int")


_register(
    Op(
        "int",
        (Arg("x", "as-is"),),
        _int,
        keys=(Key("bits", "int", 64, static=True),),
        result="int",
        no_grad="integers carry no gradient",
        # a number's integer is Python's int, whatever its width
        numbers=lambda operands, span, bits=64: scalars.function("int", operands, span),
        doc="X truncated toward zero to integers, as Python's int() and "
        "(cast x :i64): x.long(), or x.int() with :bits 32 ((cast x :i32)); X read as it "
        "is computed (an f32 value under :bf16 is not rounded first). On numbers, (int "
        "(* partial-rotary-factor head-dim)) is a number",
    )
)
_register(
    Op(
        "cast-bool",
        (Arg("x", "as-is"),),
        lambda a, ctx: b.method(a[0], "bool"),
        result="bool",
        no_grad="booleans carry no gradient",
        doc="(cast x :bool): x.bool(), true where X is not zero, X read as it is computed",
        internal=True,
    )
)


def _gelu(a, ctx):
    if ctx.attrs["approximate"] in (None, "none"):
        return b.call("F.gelu", a[0])
    return b.call("F.gelu", a[0], approximate=b.string("tanh"))


def _gelu_tanh_grad(t, n, g):
    """With u = c (x + k x³): d/dx ½x(1 + tanh u) = ½(1 + tanh u) + ½x (1 - tanh² u) c (1 + 3k x²)."""
    x = n.inputs[0]
    c, k = Scalar.lit(math.sqrt(2 / math.pi)), 0.044715
    square = t.op("*", [x, x])
    tanh = t.op(
        "tanh", [_times(t, t.op("+", [x, _times(t, square, x, Scalar.lit(k))]), c)]
    )
    slope = _times(t, t.op("+", [ONE, t.op("*", [square, Scalar.lit(3 * k)])]), c)
    rise = _times(t, x, HALF, _one_minus(t, t.op("*", [tanh, tanh])), slope)
    return [
        t.op("*", [g, t.op("+", [t.op("*", [HALF, t.op("+", [ONE, tanh])]), rise])])
    ]


_register(
    Op(
        "gelu",
        (X,),
        _gelu,
        keys=(Key("approximate", "approximate"),),
        grad=lambda t, n, g: (
            _gelu_tanh_grad(t, n, g)
            if n.attrs["approximate"] == "tanh"
            else _gelu_grad(t, n, g)
        ),
        doc=(
            "F.gelu: x Φ(x), Φ the normal CDF; :approximate :tanh is its tanh form, "
            '½x(1 + tanh(√(2/π)(x + 0.044715x³))), F.gelu(x, approximate="tanh") '
            "(GPT-2's gelu_new, Gemma's gelu_pytorch_tanh). One kernel: on bf16 input it "
            "computes in f32 and rounds once"
        ),
    )
)
_function("silu", "F.silu", "float", _silu_grad)


def _softplus(a, ctx):
    return b.call(
        "F.softplus",
        a[0],
        **given(ctx, "beta", 1.0),
        **given(ctx, "threshold", 20.0),
    )


def _softplus_grad(t, n, g):
    """torch's: the gradient passes where beta x > threshold (the linear side), else it is
    scaled by sigmoid(beta x), which is e^(beta x) / (e^(beta x) + 1)."""
    x, beta = n.inputs[0], n.attrs["beta"]
    scaled = x if known(beta) == 1 else t.op("*", [x, beta])
    linear = t.op(">", [scaled, n.attrs["threshold"]])
    return [_where(t, linear, g, _times(t, g, t.op("sigmoid", [scaled])))]


_register(
    Op(
        "softplus",
        (X,),
        _softplus,
        keys=(Key("beta", "number", 1.0), Key("threshold", "number", 20.0)),
        grad=_softplus_grad,
        bf16_risk=GROWING,
        doc=(
            "F.softplus: log(1 + e^(beta x)) / beta, and x itself where beta x > "
            ":threshold (torch's defaults: beta 1, threshold 20), so it is 100 at x = 100. "
            "One kernel: on bf16 input it computes in f32 and rounds once"
        ),
    )
)


def _pow_grad(t, n, g):
    x, p = n.inputs
    dx = _times(t, g, p, t.op("pow", [x, t.op("-", [p, ONE])]))
    dp = None if isinstance(p, Scalar) else _times(t, g, n, t.op("log", [x]))
    return [t.sum_back(dx, n, 0), None if dp is None else t.sum_back(dp, n, 1)]


_register(
    Op(
        "pow",
        (X, Arg("p")),
        lambda a, ctx: b.binop(a[0], "**", a[1]),
        grad=_pow_grad,
        numbers=partial(scalars.function, "pow"),
    )
)


def _extremum_grad(wins: str):
    """torch's rule: the larger (smaller) input takes the gradient; a tie splits it in half."""

    def grad(t, n, g):
        x, y = n.inputs
        tie = t.op("=", [x, y])
        half = t.op("*", [g, HALF])
        to_x = _where(t, t.op(wins, [x, y]), g, _where(t, tie, half, ZERO))
        to_y = _where(t, t.op(wins, [y, x]), g, _where(t, tie, half, ZERO))
        return [t.sum_back(to_x, n, 0), t.sum_back(to_y, n, 1)]

    return grad


def _extremum(torch_name: str, bound: str):
    """torch.maximum takes two tensors; against a number it is a clamp."""

    def emit(a, ctx):
        if ctx.scalars[1]:
            return b.call("torch.clamp", a[0], **{bound: a[1]})
        if ctx.scalars[0]:
            return b.call("torch.clamp", a[1], **{bound: a[0]})
        return b.call(torch_name, a[0], a[1])

    return emit


_register(
    Op(
        "maximum",
        (X, Y),
        _extremum("torch.maximum", "min"),
        result="keep",
        grad=_extremum_grad(">"),
        exact=True,
    )
)
_register(
    Op(
        "minimum",
        (X, Y),
        _extremum("torch.minimum", "max"),
        result="keep",
        grad=_extremum_grad("<"),
        exact=True,
    )
)


def _where_emit(a, ctx):
    """Two number branches would give torch's default dtype: give the compute dtype instead."""
    chosen = b.call("torch.where", *a)
    if ctx.scalars[1] and ctx.scalars[2]:
        return b.method(chosen, "to", b.dotted(ctx.tensor_dtype))
    return chosen


def _where_grad(t, n, g):
    condition = n.inputs[0]
    return [
        None,
        t.sum_back(_where(t, condition, g, ZERO), n, 1),
        t.sum_back(_where(t, condition, ZERO, g), n, 2),
    ]


_register(
    Op(
        "where",
        (Arg("condition", "bool-tensor"), X, Y),
        _where_emit,
        result="keep",
        grad=_where_grad,
        exact=True,
    )
)


def _comparison(name: str, python_op: str) -> None:
    _register(
        Op(
            name,
            (X, Y),
            lambda a, ctx: b.compare(a[0], python_op, a[1]),
            result="bool",
            numbers=partial(scalars.compare, name),
            exact=True,
            no_grad="a comparison gives booleans, which carry no gradient",
        )
    )


for _name, _python_op in (
    ("<", "<"),
    ("<=", "<="),
    (">", ">"),
    (">=", ">="),
    ("=", "=="),
):
    _comparison(_name, _python_op)


def _clamp(a, ctx):
    bounds = {k: ctx.attrs[k] for k in ("min", "max") if ctx.attrs[k] is not None}
    return b.call("torch.clamp", a[0], **bounds)


def _clamp_grad(t, n, g):
    """The gradient passes where min <= x <= max, as torch's."""
    x = n.inputs[0]
    low, high = n.attrs["min"], n.attrs["max"]
    if low is not None:
        g = _where(t, t.op("<", [x, low]), ZERO, g)
    if high is not None:
        g = _where(t, t.op(">", [x, high]), ZERO, g)
    return [g]


_register(
    Op(
        "clamp",
        (X,),
        _clamp,
        keys=(Key("min", "number"), Key("max", "number")),
        result="keep",
        grad=_clamp_grad,
    )
)
