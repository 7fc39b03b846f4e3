"""Elementwise ops: arithmetic, functions of one tensor, comparisons."""

from sx2torch.emit import build as b
from sx2torch.ops import Arg, Key, Op, register

X, Y = Arg("x"), Arg("y")


def _binary(name: str, python_op: str, arity=None, doc: str = "") -> None:
    def emit(a, ctx):
        return b.binop(a[0], python_op, a[1])

    register(Op(name, (X, Y), emit, result="arith", arity=arity, doc=doc))


_binary("+", "+", arity=(2, None), doc="n-ary sum, folded left")
_binary("*", "*", arity=(2, None), doc="n-ary product, folded left")
_binary("/", "/")
_binary("//", "//", doc="floor division (for constants, as `(// d h)`)")


def _minus(a, ctx):
    return b.neg(a[0]) if len(a) == 1 else b.binop(a[0], "-", a[1])


register(Op("-", (X, Y), _minus, result="arith", arity=(1, 2), doc="difference; negation with one argument"))
register(Op("neg", (X,), lambda a, ctx: b.neg(a[0]), result="arith"))


def _function(name: str, torch_name: str, result: str = "float") -> None:
    register(Op(name, (X,), lambda a, ctx: b.call(torch_name, a[0]), result=result))


for _name in ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos"):
    _function(_name, f"torch.{_name}")
_function("abs", "torch.abs", result="keep")
_function("relu", "torch.relu", result="keep")
_function("gelu", "F.gelu")
_function("silu", "F.silu")
register(Op("square", (X,), lambda a, ctx: b.call("torch.square", a[0]), result="keep"))
register(Op("pow", (X, Arg("p")), lambda a, ctx: b.binop(a[0], "**", a[1])))
register(Op("maximum", (X, Y), lambda a, ctx: b.call("torch.maximum", a[0], a[1]), result="keep"))
register(Op("minimum", (X, Y), lambda a, ctx: b.call("torch.minimum", a[0], a[1]), result="keep"))
register(
    Op(
        "where",
        (Arg("condition", "bool-tensor"), X, Y),
        lambda a, ctx: b.call("torch.where", *a),
        result="keep",
    )
)


def _comparison(name: str, python_op: str) -> None:
    register(Op(name, (X, Y), lambda a, ctx: b.compare(a[0], python_op, a[1]), result="bool"))


for _name, _python_op in (("<", "<"), ("<=", "<="), (">", ">"), (">=", ">="), ("=", "==")):
    _comparison(_name, _python_op)


def _clamp(a, ctx):
    bounds = {k: ctx.attrs[k] for k in ("min", "max") if ctx.attrs[k] is not None}
    return b.call("torch.clamp", a[0], **bounds)


register(
    Op(
        "clamp",
        (X,),
        _clamp,
        keys=(Key("min", "number"), Key("max", "number")),
        result="keep",
    )
)
