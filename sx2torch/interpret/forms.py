"""The special forms (let, if, for, chain, nth, cast, with-numerics, gradient) and the ops
the library defines by other ops, evaluated on tensors."""

from __future__ import annotations

import dataclasses

import torch

from sx2torch.interpret.evaluate import (
    BF16,
    DEFINED,
    FORMS,
    DTYPES,
    F32,
    F64,
    ISLAND,
    REGION,
    EvalError,
    Lam,
    dtype_of,
    is_float,
    keep_rank,
    leaf,
    tensor_of,
    zero_d,
)
import sx2torch.interpret.backward as backward
from sx2torch.interpret.model import ParamValue
from sx2torch.interpret.tape import Node
from sx2torch.syntax.read import Symbol, Vector

FIXED_POINT_ROUNDS = 4


def _let(ev, items, frame):
    for binding in items[0].items:
        target, expr = binding.items
        value = ev.eval(expr, frame)
        if isinstance(target, Vector):
            names = {t.name: leaf(v) for t, v in zip(target.items, value)}
        else:
            names = {target.name: leaf(value)}
        frame = frame.bind(names)
    return ev.body(items[1:], frame)


def _if(ev, items, frame):
    condition = ev.eval(items[0], frame)
    if not isinstance(condition, bool):
        raise EvalError("if's condition must be known when the module runs")
    chosen, other = (items[1], items[2]) if condition else (items[2], items[1])
    start = len(ev.tape)
    value = ev.eval(chosen, frame)
    if not is_float(value):
        return value
    middle = len(ev.tape)
    ev.untaken += 1
    try:
        # the branch not taken draws nothing from the generator, as in the module
        with torch.random.fork_rng(devices=[]):
            other_value = ev.eval(other, frame)
    except Exception:  # noqa: BLE001
        # a branch the module never runs here, which these values need not fit (a layer
        # norm of the other layout, an item past a list's end, a None it multiplies or
        # reshapes): its dtype is not known
        del ev.tape[middle:]
        return value
    finally:
        ev.untaken -= 1
    other_dtype = dtype_of(other_value)
    joined = ev.join(dtype_of(value), other_dtype)
    if isinstance(value, ParamValue) and isinstance(other_value, ParamValue):
        high = value.high or other_value.high
        return dataclasses.replace(value, high=high, joined=joined)
    if other_dtype is None or not other_dtype.is_floating_point:
        return value
    read = _joined(ev, value, joined)
    # 0-d by rank where both branches are
    read = Lam(read) if zero_d(value) and zero_d(other_value) else read
    # the backward walks both branches: it is joined as the forward is
    branches = {"taken": ev.tape[start:middle], "other": ev.tape[middle:]}
    ev.tape.append(Node("if", [value, other_value], branches, frame, False, read))
    return read


def _joined(ev, value, dtype):
    """The taken branch's value read in the join's dtype, a tensor of its own (the `if`'s
    result), so that its gradient is the `if`'s."""
    read = value.t.to(dtype) if isinstance(value, Lam) else ev.cast(value, dtype)
    return keep_rank(read, read.view_as(read)) if read is tensor_of(value) else read


# (cast X :i64), (cast X :i32), (cast X :bool): torch's conversions of X as it is
INTEGERS = {
    ":i64": torch.Tensor.long,
    ":i32": torch.Tensor.int,
    ":bool": torch.Tensor.bool,
}


def _cast(ev, items, frame):
    value = ev.eval(items[0], frame)
    wanted = ev.eval(items[1], frame)
    if wanted in INTEGERS:  # read as it is computed, never rounded first
        if isinstance(value, (int, float)):
            return int(value)  # a number stays one, as Python's int makes it
        return INTEGERS[wanted](tensor_of(value))
    dtype = F64 if ev.precision == "f64" else DTYPES[wanted]
    if isinstance(value, torch.Tensor) and not value.is_floating_point():
        return value.to(dtype)  # integers or booleans made floats: (cast mask :f32)
    made = Lam(value.t.to(dtype)) if isinstance(value, Lam) else ev.cast(value, dtype)
    return ev.alias(value, made, frame)


def _with_numerics(ev, items, frame):
    marks = items[0].items
    key, value = marks[0].name, marks[1].name
    mode = ISLAND if (key, value) == ("sensitivity", "high") else None
    if (key, value) == ("precision", "bf16"):
        mode = REGION
    if mode is None:
        raise EvalError(f"unknown with-numerics mark :{key} :{value}")
    body = items[1:]
    if len(body) == 1 and _head(body[0]) == "gradient":  # it marks the backward only
        return _gradient(ev, body[0].items[1:], frame, around=mode)
    return ev.body(body, frame.within(mode))


def _head(d):
    items = getattr(d, "items", None)
    return items[0].name if items and isinstance(items[0], Symbol) else None


def _gradient(ev, items, frame, around=None):
    """(gradient Y X): Y evaluated, then differentiated symbolically (backward.py);
    `around`: the mode of a with-numerics form wrapped directly around it."""
    x = ev.eval(items[1], frame)
    y = ev.eval(items[0], frame)
    value = y.t if isinstance(y, Lam) else y
    if value.dim() != 0:  # as the module's sx.expect_scalar refuses it, with the inputs
        raise ValueError(
            f"gradient needs a scalar Y, got a tensor of shape {list(value.shape)}; "
            "reduce it over all axes, as (sum ...) or (mean ...)"
        )
    return backward.gradient(ev, y, x, around)


def _layers(ev, stack, frame):
    layers = ev.eval(stack, frame)
    if not isinstance(layers, list):
        raise EvalError("a loop runs over a stack of sub-models")
    return layers


def _loop(ev, layers, carried, step, frame):
    """Runs `step(i, layer, values)` over the layers, each carried value given the join of
    its initial dtype and an iteration's, found by iterating to a fixed point."""
    dtypes = [dtype_of(v) if is_float(v) else None for v in carried]
    for _ in range(FIXED_POINT_ROUNDS if layers else 0):
        out = step(
            0, layers[0], [_to(ev, v, d, frame) for v, d in zip(carried, dtypes)]
        )
        joined = [
            ev.join(d, dtype_of(v)) if is_float(v) else d for v, d in zip(out, dtypes)
        ]
        if joined == dtypes:
            break
        dtypes = joined
    values = [_to(ev, v, d, frame) for v, d in zip(carried, dtypes)]
    for i, layer in enumerate(layers):
        out = step(i, layer, values)
        values = [_to(ev, v, d, frame) for v, d in zip(out, dtypes)]
    return values


def _to(ev, v, dtype, frame):
    if dtype is None or not is_float(v) or isinstance(v, Lam):
        return v
    return ev.alias(v, leaf(ev.cast(v, dtype)), frame)


def _for(ev, items, frame):
    header, bindings, body = items[0].items, items[1].items, items[2:]
    index = header[0].name if len(header) == 3 else None
    layer_name, stack = header[-2].name, header[-1]
    names = [b.items[0].name for b in bindings]
    carried = [ev.eval(b.items[1], frame) for b in bindings]

    def step(i, layer, values):
        bound = {layer_name: layer, **dict(zip(names, values))}
        if index:
            bound[index] = i
        out = ev.body(body, frame.bind(bound))
        return list(out) if len(names) > 1 else [out]

    values = _loop(ev, _layers(ev, stack, frame), carried, step, frame)
    return values if len(names) > 1 else values[0]


def _chain(ev, items, frame):
    layers = _layers(ev, items[0], frame)
    x = ev.eval(items[1], frame)
    args, keys = ev.arguments(items[2:], frame)

    def step(i, layer, values):
        return [ev.call(layer, "forward", [values[0], *args], keys, frame)]

    return _loop(ev, layers, [x], step, frame)[0]


def _nth(ev, items, frame):
    layers = _layers(ev, items[0], frame)
    i = ev.eval(items[1], frame)
    args, keys = ev.arguments(items[2:], frame)
    return ev.call(layers[i], "forward", args, keys, frame)


FORMS.update(
    {
        "let": _let,
        "if": _if,
        "cast": _cast,
        "with-numerics": _with_numerics,
        "gradient": _gradient,
        "for": _for,
        "chain": _chain,
        "nth": _nth,
    }
)


# Ops defined by other ops: the statistics in an island, the rest as the policy has it.


def _rms_norm(ev, args, keys, frame):
    (x,) = args
    island = frame.within(ISLAND)
    square = ev.op("*", [x, x], {}, island)
    mean = ev.op("mean", [square], {"axes": [-1], "keepdims": True}, island)
    inverse = ev.op(
        "rsqrt", [ev.op("+", [mean, keys.get("eps", 1e-6)], {}, island)], {}, island
    )
    return ev.op("*", [x, inverse], {}, frame)


def _normalize(default_axes):
    def apply(ev, args, keys, frame):
        (x,) = args
        along = {"axes": keys.get("axes", default_axes), "keepdims": True}
        island = frame.within(ISLAND)
        mean = ev.op("mean", [x], along, island)
        centred = ev.op("-", [x, mean], {}, island)
        var = ev.op("mean", [ev.op("square", [centred], {}, island)], along, island)
        eps = keys.get("eps", 1e-5)
        inverse = ev.op("rsqrt", [ev.op("+", [var, eps], {}, island)], {}, island)
        return ev.op("*", [ev.op("-", [x, mean], {}, frame), inverse], {}, frame)

    return apply


def _causal_attention(ev, args, keys, frame):
    q, k, v = args
    scores = ev.op("matmul", [q, ev.op("swap-axes", [k, -2, -1], {}, frame)], {}, frame)
    scores = ev.op("attention-scale", [scores, q], {}, frame)
    weights = ev.op("softmax", [ev.op("causal-mask", [scores], {}, frame)], {}, frame)
    return ev.op("matmul", [weights, v], {}, frame)


def _eager_attention(ev, args, keys, frame):
    """transformers' eager_attention_forward: scores scaled and masked as the policy
    computes, the softmax an island (the op's f32), read back by the matmul with V."""
    q, k, v, *mask = args
    scores = ev.op("matmul", [q, ev.op("swap-axes", [k, -2, -1], {}, frame)], {}, frame)
    if keys.get("scale") is None:
        scores = ev.op("attention-scale", [scores, q], {}, frame)
    else:
        scores = ev.op("*", [scores, keys["scale"]], {}, frame)
    if mask:
        scores = ev.op("+", [scores, mask[0]], {}, frame)
    weights = ev.op("softmax", [scores], {}, frame)
    return ev.op("matmul", [weights, v], {}, frame)


def _newton_schulz(ev, args, keys, frame):
    """Muon's quintic iteration on the normalized G, all of it in bf16, the normalization
    too (a bf16 region around the op: G is cast down as it enters); an f32 result."""
    g = ev.cast(args[0], F64 if ev.precision == "f64" else F32)
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = g.shape[-2] > g.shape[-1]
    x = g.mT if tall else g
    x = x if ev.precision == "f64" else x.to(BF16)
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(keys.get("steps", 5)):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).to(g.dtype)


DEFINED.update(
    {
        "rms-norm": _rms_norm,
        "layer-norm": _normalize([-1]),
        "batch-norm": _normalize([0]),
        "causal-attention": _causal_attention,
        "eager-attention": _eager_attention,
        "newton-schulz": _newton_schulz,
    }
)
