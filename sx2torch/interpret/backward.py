"""The backward of `(gradient Y X)`, from docs/LANGUAGE.md's rules (gradient, Precision), not
from torch.autograd's: the gradient pass differentiates the graph before the policy types
it, so each backward node is an op like any other, typed by the rules: it reads the output's
gradient and the forward values its derivative needs (as the forward op was passed them, a
parameter as its master), computes in the marks of the node it differentiates (a
`:numerics :high` read among them; a with-numerics form wrapped directly around the
gradient marks every backward node instead), and under `:bf16` is bf16 where it meets a
parameter or a bf16 value. A value read by several nodes sums their contributions in the
marks those readers share. So a gradient's dtype is its last backward node's, not X's.

The tape (tape.py) is the evaluation as it ran, loops unrolled, each `if` with both of its
branches: the backward `if` is joined with the backward of the branch not taken. A node's
derivative is written out as the rules write it where that is several ops, each rounding in
bf16 (FORMULAS); else it is torch's derivative of the op computed on its operands cast to
the backward node's dtype, rounded once. Either is itself on the tape, so a
gradient of a gradient differentiates it.
"""

from __future__ import annotations

import os
from functools import partial

import torch

import sx2torch.interpret.ops as ops
from sx2torch.interpret.evaluate import (
    ISLAND,
    EvalError,
    Frame,
    Lam,
    dtype_of,
    is_float,
    keep_rank,
    tensor_of,
    zero_d,
)
from sx2torch.interpret.model import ParamValue
from sx2torch.interpret.tape import Node

# Ops whose derivative reads the output's gradient only: a sum, a move of data, a mask or a
# comparison's choice (`(relu x)`'s backward is where(x > 0, g, 0), typed by g alone).
LINEAR = {"+", "-", "neg", "sum", "mean", "reshape", "reshape-as", "expand-as"}
LINEAR |= {"transpose", "swap-axes", "slice", "concat", "gather", "index-select"}
LINEAR |= {"scatter-add", "index-add", "cumsum", "cast-run", "attention-scale"}
LINEAR |= {"causal-mask", "take", "relu", "abs", "maximum", "minimum", "clamp", "where"}
LINEAR |= {"amax", "amin", "previous", "topk", "alias"}
LINEAR |= {
    "unsqueeze",
    "squeeze",
    "contiguous",
    "flatten",
    "repeat-interleave",
    "roll",
    "stack",
    "pad",
}
# Products: the derivative by one operand reads the others.
PRODUCTS = {"*", "matmul", "linear", "outer", "conv1d", "conv2d", "einsum"}
PRODUCTS |= {"conv-transpose1d", "conv-transpose2d"}


def gradient(ev, y, x, around=None):
    """dY/dX over the evaluator's tape; `around`: a with-numerics form's mode wrapped
    directly around the gradient, which marks every backward node."""
    want = _key(x)
    walk = _Walk(ev, _live(ev.tape, want), want, around, _seed_marks(ev.tape, y, want))
    seed = Lam(torch.ones(()))  # 0-d: the first backward node's operands decide
    grads = walk.run(list(ev.tape), {_key(y): [(seed, ())]})
    total = _total(ev, grads.get(want))
    tensor = tensor_of(x)
    if total is None:  # Y does not depend on X
        total = torch.zeros_like(tensor)
    if isinstance(total, Lam) and not zero_d(x):
        total = total.t
    return total if isinstance(total, Lam) else keep_rank(tensor, total)


def _marks(node: Node) -> tuple:
    """The modes a node computes in, outermost first: a high parameter's read an island."""
    return node.frame.marks + ((ISLAND,) if node.high else ())


def _seed_marks(tape: list, y, want) -> dict:
    """docs/LANGUAGE.md (gradient): the gradient of a full sum Y is ones of its input's
    shape made where the input is computed (a region's ones are bf16, not f32 ones cast
    down), so that backward node carries the marks of the node that made the input."""
    made = {_key(o): node for node in tape for o in _outputs(node.result)}
    node = made.get(_key(y))
    if node is None or node.name != "sum" or node.keys.get("axes") is not None:
        return {}
    producer = made.get(_key(node.args[0]))
    if producer is None or _key(node.args[0]) == want:
        return {}
    return {id(node): _marks(producer)}


class _Walk:
    """The backward of a list of tape nodes, walked in reverse: `grads` maps a value to
    its readers' contributions so far; what is left at the end are the contributions to
    values made before the list."""

    def __init__(self, ev, live: set, want, around, marks: dict):
        self.ev, self.live, self.want, self.around = ev, live, want, around
        self.marks = marks  # id(node) -> the marks its backward carries, if not its own

    def run(self, nodes: list, grads: dict) -> dict:
        within = set()  # an `if`'s branches, walked by its node
        for node in reversed(nodes):
            if id(node) in within:
                continue
            if node.name == "if":
                within.update(map(id, node.keys["taken"] + node.keys["other"]))
            gs = [self._incoming(grads, o) for o in _outputs(node.result)]
            if all(g is None for g in gs):
                continue
            marks = (self.around,) if self.around else self.marks.get(id(node))
            marks = marks or _marks(node)
            if node.name == "if":
                self._join(node, gs[0], marks, grads)
                continue
            frame = node.frame.within(marks[-1])
            for i, v in enumerate(_operands(node)):
                if _key(v) in self.live and is_float(v) and not _skipped(node, i):
                    made = _contribution(self.ev, node, gs, i, frame)
                    if made is not None:
                        grads.setdefault(_key(v), []).append((made, marks))
        return grads

    def _incoming(self, grads: dict, output):
        """The gradient reaching `output` (None for X itself: the walk stops there)."""
        if _key(output) in (None, self.want):
            return None
        return _total(self.ev, grads.pop(_key(output), None))

    def _join(self, node: Node, g, marks: tuple, grads: dict) -> None:
        """docs/LANGUAGE.md (gradient): through an `if` the backward is an `if` per value
        its branches read, each giving that value's contribution (zeros where it reads it
        not), joined as the forward `if` is. The branch not taken is walked, seeded with
        zeros of its shape, for its contributions' dtypes."""
        taken, other = node.args
        mine = self._branch(node.keys["taken"], taken, g, marks)
        theirs = self._branch(node.keys["other"], other, _zeros(g, other), marks)
        frame = node.frame.within(marks[-1])
        for key in list(mine) + [k for k in theirs if k not in mine]:
            made, unmade = mine.get(key), theirs.get(key)
            dtypes = [dtype_of(v) for v in (made, unmade) if v is not None]
            dtype = self.ev.join(dtypes[0], dtypes[-1])
            if made is None:
                made = _zeros(unmade, unmade)
            elif dtype_of(made) != dtype:
                made = self.ev.alias(made, _recast(made, dtype), frame)
            grads.setdefault(key, []).append((made, marks))

    def _branch(self, nodes: list, value, g, marks: tuple) -> dict:
        """A branch's contributions to the values made before it, from `g` at its value."""
        made = self.run(nodes, {_key(value): [(g, marks)]})
        return {
            key: _total(self.ev, contributions) for key, contributions in made.items()
        }


def _zeros(like, shaped):
    """Zeros in `like`'s dtype with `shaped`'s shape, 0-d by rank where both are."""
    tensor = tensor_of(shaped)
    zeros = keep_rank(tensor, torch.zeros(tensor.shape, dtype=dtype_of(like)))
    return Lam(zeros) if zero_d(like) and zero_d(shaped) else zeros


def _recast(v, dtype):
    return Lam(v.t.to(dtype)) if isinstance(v, Lam) else keep_rank(v, v.to(dtype))


def _key(v):
    if isinstance(v, Lam):
        return id(v.t)
    if isinstance(v, ParamValue):
        return id(v.tensor)
    return id(v) if isinstance(v, torch.Tensor) else None


def _outputs(result) -> list:
    return list(result) if isinstance(result, tuple) else [result]


def _operands(node: Node) -> list:
    """A node's operands, a list operand's items first (concat's)."""
    args = node.args
    if args and isinstance(args[0], (list, tuple)):
        return list(args[0]) + list(args[1:])
    return list(args)


def _skipped(node: Node, i: int) -> bool:
    """A shape-only operand, or integer ids: no gradient flows to it."""
    spec = ops.OPS.get(node.name)
    lists = node.args and isinstance(node.args[0], (list, tuple))
    return spec is not None and not lists and i in spec.skip


def _live(tape: list, want) -> set:
    """The values that depend on X, X's key among them."""
    live = {want}
    for node in tape:
        if any(_key(v) in live for v in _operands(node)):
            live.update(_key(o) for o in _outputs(node.result) if is_float(o))
    return live


def _total(ev, contributions):
    """A value's gradient: its readers' contributions summed in the marks they share, the
    innermost of the forms around them all (an island's and its region's: the region).
    """
    if not contributions:
        return None
    shared = os.path.commonprefix([marks for _, marks in contributions])  # of tuples
    frame = Frame(ev.top, {}, shared[-1] if shared else None)
    total = contributions[0][0]
    for made, _ in contributions[1:]:
        total = ev.op("+", [total, made], {}, frame)
    return total


def _contribution(ev, node: Node, gs: list, i: int, frame: Frame):
    """The node's backward by its operand `i`: torch's derivative of the op, computed on
    its operands cast to the dtype the rules give that backward node."""
    flat = _operands(node)
    if _passes_on(node, i):  # no backward node, so no marks: summed back in g's dtype
        g = _sum_to(ev, tensor_of(gs[0]), flat[i], frame)
        return Lam(g) if zero_d(flat[i]) else g
    formula = _formula(node)
    if formula is not None:
        made = formula(_Writer(ev, frame), gs[0], flat, node.result, i)
        return _sum_to(ev, made, flat[i], frame)
    given = [g for g in gs if g is not None]
    dtype = ev.decide(given + _reads(node, flat, i), frame.mode) or dtype_of(given[0])
    fn = _function(ev, node)
    operands = [g for g in gs] + flat
    k = len(gs)

    def derivative(tensors):
        return _vjp(fn, tensors[:k], tensors[k:], i, dtype)

    tensors = [_read(ev, v, dtype, node, j - k) for j, v in enumerate(operands)]
    made = derivative(tensors)
    if made is None:
        return None
    value = Lam(made) if zero_d(flat[i]) and made.dim() == 0 else made
    ev.tape.append(Node("vjp", operands, {}, frame, False, value, fn=derivative))
    return value


def _passes_on(node: Node, i: int) -> bool:
    """docs/LANGUAGE.md (gradient): the derivative is the gradient itself (a cast the rules
    insert, `cast-run`, `+`, `-` by its first operand), summed back where the forward
    broadcast the operand."""
    first = node.name == "-" and i == 0 and len(node.args) == 2
    return node.name in ("alias", "cast-run", "+") or first


class _Writer:
    """Ops of a derivative written out, each a node in the backward's marks."""

    def __init__(self, ev, frame: Frame):
        self.ev, self.frame = ev, frame

    def __getattr__(self, name: str):
        op = {"mul": "*", "add": "+", "sub": "-", "div": "/"}.get(name, name)
        return lambda *args: self.ev.op(op, list(args), {}, self.frame)


def _sum_to(ev, made, like, frame: Frame):
    """A contribution summed back over the axes its operand was broadcast along."""
    shape = tensor_of(like).shape
    tensor = tensor_of(made)
    if tensor.shape == shape:
        return made
    summed = tensor.sum_to_size(shape)
    fn = lambda tensors: tensors[0].sum_to_size(shape)  # noqa: E731
    ev.tape.append(Node("vjp", [made], {}, frame, False, summed, fn=fn))
    return summed


def _read(ev, v, dtype, node: Node, j: int):
    """Operand `j` of the derivative (j < 0: an output's gradient) in `dtype`."""
    if v is None or not is_float(v) or (j >= 0 and _skipped(node, j)):
        return tensor_of(v)
    if j < 0 and node.name in CONTIGUOUS_GRADIENT:
        return ev.cast(v, dtype).contiguous()
    return ev.cast(v, dtype)


# Ops whose derivative the module computes on a contiguous gradient, as torch's own
# backward kernel takes it: the differentiable backward of F.group_norm adds up its sums
# in the order of the gradient's layout, so a transposed gradient gave another f32
# rounding (sx.group_norm_backward).
CONTIGUOUS_GRADIENT = {"group-norm"}


def _vjp(fn, gs: list, tensors: list, i: int, dtype):
    """The gradient by `tensors[i]` of `fn(tensors)` against the outputs' `gs`."""
    tensors = list(tensors)
    target = tensors[i]
    target = target.view_as(target) if target.requires_grad else target.detach()
    tensors[i] = target.requires_grad_() if not target.requires_grad else target
    with torch.enable_grad():
        outputs = _outputs(fn(tensors))
    pairs = [
        (o, g.to(o.dtype))
        for o, g in zip(outputs, gs)
        if g is not None and o.is_floating_point() and o.requires_grad
    ]
    if not pairs:
        return None
    (made,) = torch.autograd.grad(
        [o for o, _ in pairs],
        [tensors[i]],
        [g for _, g in pairs],
        create_graph=True,
        allow_unused=True,
    )
    return None if made is None else made.to(dtype)


def _function(ev, node: Node):
    """The node's outputs as a function of its operands' tensors (concat's items first)."""
    if node.fn is not None:
        return node.fn
    spec = ops.OPS[node.name]
    if spec.training:  # a fresh draw would be another function
        raise EvalError(f"no derivative rule for {node.name}")
    lists = node.args and isinstance(node.args[0], (list, tuple))
    n = len(node.args[0]) if lists else 0

    def fn(tensors):
        args = [list(tensors[:n]), *tensors[n:]] if lists else tensors
        return spec.fn(args, node.keys)

    return fn


# The derivatives the rules write out as several ops, each rounding where it computes in
# bf16 (golden gradient-region-reads: grad * (1.0 - square(tanh_x))), as (w, g, operands,
# y, i) -> the contribution before it is summed to the operand's shape; the rest are
# torch's, one rounding.
FORMULAS = {
    "/": lambda w, g, a, y, i: (
        w.div(g, a[1]) if i == 0 else w.neg(w.div(w.mul(g, y), a[1]))
    ),
    "tanh": lambda w, g, a, y, i: w.mul(g, w.sub(1.0, w.square(y))),
    "sigmoid": lambda w, g, a, y, i: w.mul(w.mul(g, y), w.sub(1.0, y)),
    "exp": lambda w, g, a, y, i: w.mul(g, y),
    "log": lambda w, g, a, y, i: w.div(g, a[0]),
    "log1p": lambda w, g, a, y, i: w.div(g, w.add(a[0], 1.0)),
    "expm1": lambda w, g, a, y, i: w.mul(g, w.add(y, 1.0)),
    "sqrt": lambda w, g, a, y, i: w.div(g, w.mul(2.0, y)),
    "rsqrt": lambda w, g, a, y, i: w.mul(w.mul(g, -0.5), w.pow(y, 3)),
    "sin": lambda w, g, a, y, i: w.mul(g, w.cos(a[0])),
    "cos": lambda w, g, a, y, i: w.neg(w.mul(g, w.sin(a[0]))),
    "square": lambda w, g, a, y, i: w.mul(g, w.mul(2.0, a[0])),
    "erf": lambda w, g, a, y, i: w.mul(
        w.mul(g, 1.1283791670955126), w.exp(w.mul(-1.0, w.square(a[0])))
    ),
    "silu": lambda w, g, a, y, i: _silu(w, g, a[0], w.sigmoid(a[0])),
    "gelu": lambda w, g, a, y, i: w.mul(g, _gelu_slope(w, a[0])),
    "gelu:tanh": lambda w, g, a, y, i: w.mul(g, _tanh_gelu_slope(w, a[0])),
}


def _formula(node: Node):
    """The node's derivative written out, by its op and :approximate form; None: torch's."""
    if node.name == "softplus":
        return partial(_softplus, node.keys)
    approximate = node.keys.get("approximate", ":none")
    return FORMULAS.get(
        node.name if approximate == ":none" else node.name + approximate
    )


def _gelu_slope(w, x):
    cdf = w.mul(0.5, w.add(1.0, w.erf(w.mul(x, 0.7071067811865475))))
    pdf = w.mul(0.3989422804014327, w.exp(w.mul(-0.5, w.square(x))))
    return w.add(cdf, w.mul(x, pdf))


def _tanh_gelu_slope(w, x):
    """With u = c (x + k x³): ½(1 + tanh u) + ½x (1 - tanh² u) c (1 + 3k x²)."""
    c, k = 0.7978845608028654, 0.044715
    square = w.mul(x, x)
    tanh = w.tanh(w.mul(w.add(x, w.mul(w.mul(square, x), k)), c))
    slope = w.mul(w.add(1.0, w.mul(square, 3 * k)), c)
    rise = w.mul(w.mul(w.mul(x, 0.5), w.sub(1.0, w.mul(tanh, tanh))), slope)
    return w.add(w.mul(0.5, w.add(1.0, tanh)), rise)


def _softplus(keys, w, g, a, y, i):
    """torch's: g where beta x > threshold, else g sigmoid(beta x) (beta 1: x itself)."""
    beta = keys.get("beta", 1.0)
    scaled = a[0] if beta == 1 else w.mul(a[0], beta)
    linear = getattr(w, ">")(scaled, keys.get("threshold", 20.0))
    return w.where(linear, g, w.mul(g, w.sigmoid(scaled)))


def _silu(w, g, x, s):
    return w.mul(w.mul(g, s), w.add(1.0, w.mul(x, w.sub(1.0, s))))


def _reads(node: Node, flat: list, i: int) -> list:
    """The forward values the derivative by operand `i` reads, which decide its dtype."""
    floats = [
        (j, v) for j, v in enumerate(flat) if is_float(v) and not _skipped(node, j)
    ]
    if node.name in LINEAR:
        return []
    if node.name in PRODUCTS:
        return [v for j, v in floats if j != i]
    if node.name == "/":  # g / b by the numerator; -(g * y / b) by the denominator
        return flat[1:2] if i == 0 else [node.result, flat[1]]
    return [v for _, v in floats]
