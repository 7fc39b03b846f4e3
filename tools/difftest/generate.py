"""Random well-formed SexpGPU programs, typed by shape so that every one compiles.

A program has a sub-model `blk` (a parameter, a forward with a `&key`, a list `&key`), an
instance of it and a stack of two (in some, its count a list const's length and its widths
the list's elements), top-level parameters with every storage option, a `helper` defun
with a `&key` and `forward`; expressions are drawn for a wanted shape from ops, forms and calls.
The header line records what the checks need: the methods to call and their inputs.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace

B, D = 2, 4  # rows of the input, and the model's width `d`
ROWS, VEC, MAT, ZERO = (B, D), (D,), (D, D), ()
ROWS1 = (B, 1)
TABLE = (8, D)
UNARY = [
    "neg",
    "abs",
    "relu",
    "square",
    "tanh",
    "sigmoid",
    "silu",
    "gelu",
    "erf",
    "sin",
]
UNARY += ["cos", "exp", "softplus", "expm1"]
SMOOTH = ["neg", "square", "tanh", "sigmoid", "silu", "gelu", "erf", "sin", "cos"]
SMOOTH += ["softplus"]
BINARY = ["+", "-", "*", "maximum", "minimum"]
COMPARE = ["<", "<=", "=", ">", ">="]
EXACT = {"+", "-", "*", "neg", "abs", "relu", "square", "maximum", "minimum", "matmul"}
EXACT |= {"linear", "sum", "mean", "amax", "amin", "slice", "concat", "reshape", "at"}
EXACT |= {
    "transpose",
    "swap-axes",
    "where",
    "take",
    "one-hot",
    "zeros-like",
    "ones-like",
}
EXACT |= {"expand-as", "reshape-as", "clamp", "causal-mask", "cast", "outer"}
EXACT |= {"<", "<=", "=", ">", ">="}
EXACT |= {"max-pool1d", "max-pool2d", "interpolate", "topk", "gather", "argmax"}
EXACT |= {"index-select", "positions", "mod", "//", "arange", "arange-of", "size"}
EXACT |= {"len"}
EXACT |= {"cast-run", "scalar-like"}
EXACT |= {
    "unsqueeze",
    "squeeze",
    "contiguous",
    "flatten",
    "repeat-interleave",
    "roll",
    "stack",
    "pad",
}
EXACT |= {"floor", "ceil", "int", "cast-bool"}
# Ops no program draws: random draws (dropout, rand-like, randn-like), which the module
# and the interpreter would take from torch's generator in different orders; and
# batch-norm, whose statistics over the B = 2 rows make gradients ill-conditioned.
NOT_DRAWN = {"dropout", "rand-like", "randn-like", "batch-norm"}


@dataclass
class Scope:
    """What an expression may read: names by shape, and where it is drawn."""

    names: dict  # shape -> [name]
    params: dict  # shape -> [param name]
    ids: bool = False  # an integer input `ids` of shape [B] is in scope
    # a boolean input `keep` of shape [B D] is in scope: where's condition, and (sliced to
    # [B B], its diagonal true) attention's mask, as a caller passes it (issue 38)
    keep: bool = False
    calls: bool = True  # helper and sub-model calls allowed (not inside blk or helper)
    smooth: bool = False  # inside a gradient's Y: only ops with derivative rules
    wrt: str = ""  # the gradient's X, which Y must read
    keys: tuple = ()  # &key numbers in scope, read as operands
    conditions: tuple = ("flag", "(< d 3)", "(= d 4)", "(not flag)", "(in d [2 4])")

    def with_name(self, name: str, shape: tuple) -> "Scope":
        names = {s: list(v) for s, v in self.names.items()}
        names.setdefault(shape, []).append(name)
        return replace(self, names=names)

    def smooth_in(self, wrt: str) -> "Scope":
        return replace(self, smooth=True, wrt=wrt)


@dataclass
class Gen:
    rng: random.Random
    budget: int = 14  # nodes left in this defun
    ops: set = field(default_factory=set)
    exact: bool = False  # only ops whose results the data make exact

    def pick(self, *options):
        return self.rng.choice(options)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def expr(self, shape: tuple, scope: Scope, depth: int) -> str:
        self.budget -= 1
        if depth <= 0 or self.budget <= 0 or self.chance(0.2):
            return self.leaf(shape, scope)
        makers = [self.elementwise, self.binary, self.form]
        makers += {
            ROWS: [self.rows, self.rows, self.tensor, self.views]
            + ([] if self.exact else [self.library]),
            VEC: [self.vec],
            MAT: [self.mat],
            ZERO: [self.zero],
        }[shape]
        return self.rng.choice(makers)(shape, scope, depth - 1)

    def use(self, op: str) -> str:
        self.ops.add(op)
        return op

    def leaf(self, shape: tuple, scope: Scope) -> str:
        names = scope.names.get(shape, []) + scope.params.get(shape, [])
        if scope.wrt and scope.wrt in names and self.chance(0.5):
            return scope.wrt
        if names:
            return self.rng.choice(names)
        if shape == ZERO:
            vec = scope.params.get(VEC) or scope.names.get(VEC)
            if vec and not scope.smooth:
                return (
                    f"({self.use('at')} {self.rng.choice(vec)} {self.rng.randrange(D)})"
                )
            return f"({self.use('sum')} {self.leaf(ROWS, scope)})"
        if shape == VEC:
            return f"({self.use('sum')} {self.leaf(ROWS, scope)} :axes [0])"
        if shape == MAT and not scope.smooth:
            return (
                f"({self.use('outer')} {self.leaf(VEC, scope)} {self.leaf(VEC, scope)})"
            )
        if shape == MAT:
            return f"({self.use('expand-as')} {self.leaf(VEC, scope)} (ones-like w1))"
        return f"({self.use('expand-as')} {self.leaf(VEC, scope)} x)"

    def elementwise(self, shape, scope, depth):
        ops = SMOOTH if scope.smooth else UNARY
        op = self.use(
            self.rng.choice([o for o in ops if o in EXACT] if self.exact else ops)
        )
        inner = self.expr(shape, scope, depth)
        if op in ("exp", "expm1"):
            inner = f"({self.use('tanh')} {inner})"
        if op == "gelu" and self.chance(0.3):
            return f"(gelu {inner} :approximate :tanh)"
        return f"({op} {inner})"

    def operand(self, shape, scope, depth) -> str:
        """An operand broadcasting to `shape`: its own shape, a lower one, or a number."""
        choice = self.rng.random()
        if choice < 0.15:
            return self.pick("2.0", "0.5", "-1.5", "0.25", "3", *scope.keys)
        if choice < 0.17:
            return self.pick(
                f"({self.use('size')} x :axis {self.pick(0, 1)})",
                f"({self.use('len')} x)",
                f"({self.use('scalar-like')} x {self.pick('2.0', '0.5')})",
            )
        if choice < 0.3 and shape == ROWS:
            red = self.pick("sum", "mean", "amax") if not scope.smooth else "mean"
            inner = self.expr(ROWS, scope, depth - 1)
            return f"({self.use(red)} {inner} :axes [-1] :keepdims true)"
        if choice < 0.45 and shape in (ROWS, MAT):
            return self.expr(VEC, scope, depth)
        if choice < 0.55 and shape != ZERO:
            return self.expr(ZERO, scope, depth)
        return self.expr(shape, scope, depth)

    def binary(self, shape, scope, depth):
        op = self.use(self.rng.choice(["+", "-", "*"] if scope.smooth else BINARY))
        a, b = self.expr(shape, scope, depth), self.operand(shape, scope, depth)
        if op in ("maximum", "minimum"):
            if not b.startswith("("):
                b = f"(* ({self.use('ones-like')} {a}) {b})"
        elif self.chance(0.3):
            a, b = b, a
        if op in ("+", "*") and self.chance(0.15):
            return f"({op} {a} {b} {self.operand(shape, scope, depth)})"
        return f"({op} {a} {b})"

    def rows(self, shape, scope, depth):
        kind = self.rng.randrange(10)
        x = self.expr(ROWS, scope, depth)
        if kind == 0:
            out = " :out :f32" if self.chance(0.4) else ""
            return f"({self.use('matmul')} {x} {self.expr(MAT, scope, depth)}{out})"
        if kind == 1:
            return f"({self.use('linear')} {x} {self.expr(MAT, scope, depth)})"
        if kind == 2:
            halves = f"(slice {x} :axis 1 :start 2) (slice {x} :axis 1 :end 2)"
            self.use("slice")
            return f"({self.use('concat')} [{halves}] :axis 1)"
        if kind == 3:
            self.use("transpose")
            return f"({self.use('reshape')} (transpose {x} [1 0]) [{B} {D}])"
        if kind == 4 and not scope.smooth:
            a, b = x, self.operand(ROWS, scope, depth)
            cond = f"({self.use(self.rng.choice(COMPARE))} {a} {b})"
            if scope.keep and self.chance(0.3):
                cond = "keep"
            return f"({self.use('where')} {cond} {x} {self.expr(ROWS, scope, depth)})"
        if kind == 5 and scope.ids and not scope.smooth:
            if self.chance(0.5):
                return f"({self.use('one-hot')} ids {D})"
            # torch's embedding with a padding row, whose gradient is zero: rows 0 and 3
            # (-5 of TABLE's 8, from the end), which `ids` (0 to D - 1) reach
            padding = self.pick("", "", " :padding-idx 0", " :padding-idx -5")
            return f"({self.use('take')} {self.pick('table', 'table')} ids{padding})"
        if kind == 6 and not scope.smooth:
            return f"({self.use('clamp')} {x} :min -1.0 :max 1.5)"
        if kind == 7:
            return (
                f"({self.use('swap-axes')} ({self.use('reshape')} {x} [{D} {B}]) 0 1)"
            )
        if kind == 8:
            return (
                f"({self.use('reshape-as')} ({self.use('reshape')} {x} [{B * D}]) {x})"
            )
        return f"({self.use('matmul')} {x} {self.leaf(MAT, scope)})"

    def views(self, shape, scope, depth):
        """The views, each back to [B D]: they move data, round nowhere, and each has a
        derivative rule."""
        x = self.expr(ROWS, scope, depth)
        axis = self.pick(0, 1, 2, -1, -2, -3)
        start = self.pick(0, 1)
        forms = {
            "squeeze": f"(squeeze (unsqueeze {x} :axis {axis}) :axis {axis})",
            "contiguous": f"(swap-axes (contiguous (swap-axes {x} 0 1)) 0 1)",
            "flatten": self.pick(
                f"(flatten (reshape {x} [{B} 2 2]) :start 1)",
                f"(reshape (flatten {x}) [{B} {D}])",
            ),
            "repeat-interleave": f"(repeat-interleave (slice {x} :axis {self.pick(1, -1)} "
            f":start {self.pick(0, 1)} :step 2) :repeats 2 :axis 1)",
            "roll": f"(roll {x} :shifts {self.pick(1, -1, 3)}"
            f"{self.pick('', ' :axis 0', ' :axis 1', ' :axis -1')})",
            "stack": "",  # made below, where drawn: it draws a second operand
            "pad": f"(slice (pad {x} [1 2]{self.pick('', ' :value 0.5')}) :axis 1 "
            f":start {start} :end {start + D})",
        }
        op = self.use(self.rng.choice(sorted(forms)))
        if op == "stack":
            y = self.expr(ROWS, scope, depth - 1)
            forms[op] = (
                f"(flatten (slice (stack [{x} {y}] :axis {self.pick(2, -1)}) :axis 2 "
                f":start {start} :end {start + 1}) :start 1)"
            )
        for used in ("unsqueeze", "slice", "reshape", "flatten", "swap-axes"):
            if f"({used} " in forms[op]:
                self.use(used)
        return forms[op]

    def library(self, shape, scope, depth):
        x, y = self.expr(ROWS, scope, depth), self.expr(ROWS, scope, depth - 1)
        # no batch-norm: its statistics over the B = 2 rows make gradients ill-conditioned
        simple = ["softmax", "log-softmax", "rms-norm", "layer-norm"]
        forms = {
            "softcap": f"(softcap {x} 2.0)",
            "/": f"(/ {x} (+ (abs {y}) 1.0))",
            "log": f"(log (+ (square {x}) 1.0))",
            "log1p": f"(log1p (square {x}))",
            "softplus": f"(softplus {x} :beta 2.0 :threshold 1)",
            "sqrt": f"(sqrt (+ (square {x}) 0.25))",
            "rsqrt": f"(rsqrt (+ (square {x}) 1.0))",
            "pow": f"(pow {x} 2)",
            "fused-rms-norm": f"(fused-rms-norm {x}{self.pick('', ' v')})",
            "fused-layer-norm": f"(fused-layer-norm {x}{self.pick('', ' v', ' v v')})",
            "group-norm": f"(group-norm {x} {self.pick(1, 2)}"
            f"{self.pick('', ' v', ' v v')})",
            "causal-attention": f"(causal-attention {x} {y} {x})",
            "eager-attention": f"(eager-attention {x} {y} {x}"
            f"{self.pick('', f' (matmul {y} (swap-axes {x} 0 1))')}"
            f"{self.pick('', ' :scale 0.3')})",
            "linear-scan": f"(linear-scan (sigmoid {x}) {y})",
            "logsumexp": f"(+ {x} (logsumexp {y} :axes [-1] :keepdims true))",
            **{op: f"({op} {x})" for op in simple},
            "softmax": f"(softmax {x}{self.pick('', ' :dtype :input')})",
        }
        if not scope.smooth:
            forms["previous"] = f"(previous {x} :axis 1)"
            forms["attention"] = f"(attention {x} {y} {x} :causal true)"
            if scope.keep and self.chance(0.5):  # a mask [T S] = [B B] from an argument
                rows = self.pick("keep", self.leaf(ROWS, scope))
                forms["attention"] = f"(attention {x} {y} {x} (slice {rows} :axis 1 :end {B}))"
        if "v" not in scope.params.get(VEC, []):
            forms["fused-rms-norm"] = f"(fused-rms-norm {x})"
            forms["fused-layer-norm"] = f"(fused-layer-norm {x})"
            forms["group-norm"] = f"(group-norm {x} 2)"
        op = self.use(self.rng.choice(sorted(forms)))
        return forms[op]

    def tensor(self, shape, scope, depth):
        """Convolutions, pooling, routing and the integer ops, each back to [B D]."""
        x, y = self.expr(ROWS, scope, depth), self.expr(ROWS, scope, depth - 1)
        seq, image = f"(reshape {x} [1 {B} {D}])", f"(reshape {x} [1 1 {B} {D}])"
        back = f"[{B} {D}]"
        smooth = {  # ops with derivative rules, fit for a gradient's Y
            "cumsum": f"(cumsum {x} :axis {self.pick(0, 1, -1)})",
            "einsum": self.pick(
                f'(einsum "bi,ij->bj" {x} {self.leaf(MAT, scope)})',
                f'(einsum "bi,ji->bj" {x} {self.leaf(MAT, scope)})',
                f'(einsum "bi,bi,ij->bj" {x} {y} {self.leaf(MAT, scope)})',
            ),
            "gather": f"(let (([tv ti] (topk {x} 2))) "
            f"(concat [tv (gather {y} ti :axis 1)] :axis 1))",
            "scatter-add": f"(let (([tv ti] (topk {y} 2))) "
            f"(scatter-add {x} ti tv :axis 1))",
            "index-add": f"(index-add {x} (argmax {y} :axis 0) "
            f"{self.expr(MAT, scope, depth - 1)})",
            "attention-scale": f"(attention-scale {x} {y})",
            "cast-run": f"(cast-run {x})",
            "zeros-like": f"(+ {x} (zeros-like {y}))",
            "expand-as": f"(* {x} (expand-as {self.leaf(VEC, scope)} {y}))",
            "matrix-scan": f"(matrix-scan (* 0.5 {self.leaf(MAT, scope)}) {x} :axis 0)",
        }
        rough = {
            "max-pool1d": f"(reshape (interpolate (max-pool1d {seq} 2) :scale-factor 2) "
            f"{back})",
            "avg-pool1d": f"(reshape (interpolate (avg-pool1d {seq} 2) :scale-factor 2) "
            f"{back})",
            "max-pool2d": f"(reshape (interpolate (max-pool2d {image} 2) :size {back}) "
            f"{back})",
            "avg-pool2d": f"(reshape (interpolate (avg-pool2d {image} 2 :stride 1 "
            f":padding 1) :size {back}) {back})",
            "floor": f"(floor (* 4 {x}))",
            "cast-bool": f"(* {x} (cast (cast (relu {x}) :bool) {self.pick(':f32', ':bf16')}))",
            "ceil": f"(ceil (* 4 {x}))",
        }
        if "table" in scope.params.get(TABLE, []):  # the top level's parameters
            smooth["conv1d"] = f"(reshape (conv1d {seq} wc :padding 1) {back})"
            # the same weights as a transposed convolution's: [C_in, C_out, K]
            smooth["conv-transpose1d"] = (
                f"(reshape (conv-transpose1d {seq} wc :padding 1) {back})"
            )
            smooth["conv-transpose2d"] = (
                f"(reshape (conv-transpose2d {image} wk :padding 1) {back})"
            )
            smooth["conv2d"] = f"(reshape (conv2d {image} wk :padding 1) {back})"
            rough["argmax"] = f"(take table (argmax {x} :axis 1))"
            whole = self.pick("(int ", "(cast ") + f"(* 4 (amax {x} :axes [1]))"
            whole += self.pick(")", " :i64)", " :i32)")
            # integer sums, int64 as torch's: of an integer cast, of a cumsum of booleans
            whole = self.pick(
                whole,
                f"(sum (cast (* 4 {x}) :i64) :axes [1])",
                f"(sum (cumsum (cast (> {x} 0) :i32) :axis 1) :axes [1])",
            )
            rough["int"] = f"(take table (mod {whole} {TABLE[0]}))"
            rough["sparse-experts"] = (
                f"(let (([tv ti] (topk (matmul {x} wr) {self.pick(1, 2)}"
                f"{self.pick('', ' :sorted false')}))) "
                f"(sparse-experts {x} ti (softmax tv) gu dn))"
            )
        if scope.ids:
            rough["positions"] = "(take table (positions ids :axis 0))"
            rough["mod"] = "(take table (mod ids 3))"
            rough["//"] = "(take table (// ids 2))"
            rough["index-select"] = "(index-select table ids)"
        forms = smooth if scope.smooth else {**smooth, **rough}
        names = sorted(o for o in forms if o in EXACT or not self.exact)
        if not names:
            return self.rows(shape, scope, depth)
        op = self.use(self.rng.choice(names))
        return forms[op]

    def reduction(self, scope, rough: str) -> str:
        """sum or mean, or the non-smooth `rough` where no derivative is taken."""
        return self.pick("sum", "mean", *([] if scope.smooth else [rough]))

    def vec(self, shape, scope, depth):
        kind = self.rng.randrange(4)
        if kind == 3:
            v = self.expr(VEC, scope, depth)
            made = {
                "arange": f"(arange {v} 0 {D} 1)",
                "arange-of": f"(arange-of {v})",
                "linspace": f"(linspace {v} -1.0 1.0 {D})",
            }
            if self.exact:
                made.pop("linspace")
            op = self.use(self.pick(*sorted(made)))
            return f"(+ {v} {made[op]})"
        if kind == 0:
            mat = self.expr(MAT, scope, depth)
            if scope.smooth:
                return f"({self.use('sum')} {mat} :axes [0])"
            return f"({self.use('at')} {mat} {self.rng.randrange(D)})"
        if kind == 1:
            return f"({self.use('matmul')} {self.expr(VEC, scope, depth)} {self.expr(MAT, scope, depth)})"
        red = self.reduction(scope, "amin")
        return f"({self.use(red)} {self.expr(ROWS, scope, depth)} :axes [0])"

    def mat(self, shape, scope, depth):
        kind = self.rng.randrange(5)
        m = self.expr(MAT, scope, depth)
        if kind == 0:
            return f"({self.use('transpose')} {m} [1 0])"
        if kind == 1 and not scope.smooth:
            return f"({self.use('causal-mask')} {m} :fill -2.0)"
        if kind == 2 and not scope.smooth:
            return f"({self.use('outer')} {self.expr(VEC, scope, depth)} {self.leaf(VEC, scope)})"
        if kind == 3 and not scope.smooth and not self.exact:
            return f"({self.use('newton-schulz')} {m} :steps {self.pick(1, 2)})"
        return f"({self.use('matmul')} {m} {self.expr(MAT, scope, depth)})"

    def zero(self, shape, scope, depth):
        if scope.ids and not scope.smooth and not self.exact and self.chance(0.15):
            return f"({self.use('cross-entropy')} {self.expr(ROWS, scope, depth)} ids)"
        if self.chance(0.5) and not scope.smooth:
            vec = self.expr(VEC, scope, depth)
            element = f"({self.use('at')} {vec} {self.rng.randrange(D)})"
            if self.chance(0.3):  # a cast of a 0-d element, to its own dtype or not
                return f"(cast {element} {self.pick(':bf16', ':f32')})"
            return element
        red = self.reduction(scope, "amax")
        return f"({self.use(red)} {self.expr(self.pick(ROWS, VEC), scope, depth)})"

    def form(self, shape, scope, depth):
        kind = self.rng.randrange(10)
        if kind == 0:
            name = self.pick("h", "a", "b")
            bound_shape = self.pick(shape, ROWS)
            value = self.expr(bound_shape, scope, depth)
            body = self.expr(shape, scope.with_name(name, bound_shape), depth)
            return f"(let (({name} {value})) {body})"
        if kind == 1:
            cond = self.rng.choice(scope.conditions)
            return f"(if {cond} {self.expr(shape, scope, depth)} {self.expr(shape, scope, depth)})"
        if kind == 2:
            return f"({self.use('cast')} {self.expr(shape, scope, depth)} {self.pick(':bf16', ':f32')})"
        if kind == 3:
            return (
                f"(with-numerics (:sensitivity :high) {self.expr(shape, scope, depth)})"
            )
        if kind == 4:
            return (
                f"(with-numerics (:precision :bf16) {self.expr(shape, scope, depth)})"
            )
        if kind == 5 and not scope.smooth and shape in (ROWS, MAT, VEC):
            return self.gradient(shape, scope, depth)
        if shape == ROWS and scope.calls:
            return self.call(scope, depth)
        return self.expr(shape, scope, depth)

    def gradient(self, shape, scope, depth):
        wrt = [n for n in scope.names.get(shape, []) + scope.params.get(shape, [])]
        if not wrt:
            return self.expr(shape, scope, depth)
        x = self.rng.choice(wrt)
        inner = self.expr(self.pick(ROWS, shape), scope.smooth_in(x), depth)
        if scope.calls and shape == ROWS and self.chance(0.3):  # a loop reading x too
            start = self.pick(x, inner)
            inner = f"(for (layer blocks) ((c {start})) (layer (* c {x})))"
        if not re.search(rf"(?<![\w.-]){x}(?![\w.-])", inner):
            inner = f"(* {inner} {x})" if shape == ROWS else f"(matmul x {x})"
        if re.match(r"\((softmax|layer-norm|fused-layer-norm|group-norm) ", inner):
            # rows that sum to a constant (unweighted): Y's gradient would be rounding noise
            inner = f"({self.use('exp')} {inner})"
        self.use("gradient")
        return f"(gradient ({self.pick('sum', 'mean')} {inner}) {x})"

    def call(self, scope, depth):
        x = self.expr(ROWS, scope, depth)
        kind = self.rng.randrange(7)
        if kind == 6:  # a layer of the library (LAYERS): a model of the compiler's
            return f"({self.rng.choice(LAYERS)[0]} {x})"
        if kind == 0:
            key = f" :k {self.pick('0.5', '2.0', '-1.0')}" if self.chance(0.5) else ""
            return f"(helper {x}{key})"
        if kind == 1:
            key = " :k 3.0" if self.chance(0.5) else ""
            return f"(sub {x}{key})"
        if kind == 2:
            return f"(chain blocks {x})"
        if kind == 3:
            return f"(nth blocks {self.rng.randrange(2)} {x})"
        if kind == 4:
            return f"(* {x} (sum sub.w :axes [0]))"
        body = self.expr(ROWS, scope.with_name("c", ROWS), depth)
        if self.chance(0.5):
            body = f"(* c {self.pick('x', body)})"
            return f"(for (i layer blocks) ((c {x})) (layer {body}))"
        # a value the first layer computes and the others read, started as none (T5's
        # position bias), made of what the draws above made
        shared = "(if (= i 0) (layer c) s)"
        step = f"(let ((s {shared})) [(layer (+ {body} s)) s])"
        return f"(let (([c _] (for (i layer blocks) ((c {x}) (s none)) {step}))) c)"


PARAM_OPTIONS = ["", "", "", " :numerics :high", " :trainable false", " :dtype :bf16"]


def program(seed: int) -> tuple:
    """(source, {method: [input names]}) of one random program."""
    rng = random.Random(seed)
    g = Gen(rng, exact=seed % 2 == 0)
    top = Scope(
        {ROWS: ["x"]},
        {MAT: ["w1", "w2"], VEC: ["v"], TABLE: ["table"]},
        ids=True,
        keep=True,
    )
    inner = Scope({ROWS: ["x"]}, top.params, calls=False, smooth=True, keys=("k",))
    g.budget = 10
    helper = g.expr(ROWS, inner, 4)
    g.budget = 16
    forward = g.rng.choice([g.rows, g.binary, g.form, g.elementwise])(ROWS, top, 5)
    lines = [f"(defconst d {D})", f"(defconst flag {rng.choice(['true', 'false'])})"]
    lines.append("(defconst widths [d d])")  # a list const, read by the stacks and blk
    if re.search(r"\b(sub|blocks)\b", forward):
        lines += [
            "(defmodel blk (&key (d 4) (idx 0) (odd [1 3]))",
            f"  (defparam w (normal [d d]){rng.choice(PARAM_OPTIONS)})",
            f"  (defun forward (x &key (k 1.0)) {_blk_body(g)}))",
            "(defparam sub (blk :d d))",
            f"(defparam blocks {rng.choice(STACKS)})",
        ]
    for name, shape in (
        ("w1", "[d d]"),
        ("w2", "[d d]"),
        ("v", "[d]"),
        ("table", "[8 d]"),
    ):
        lines.append(f"(defparam {name} (normal {shape}){rng.choice(PARAM_OPTIONS)})")
    for name, shape in TENSOR_PARAMS:
        if re.search(rf"\b{name}\b", helper + forward):
            lines.append(f"(defparam {name} (normal {shape}))")
    for name, instance in LAYERS:
        if re.search(rf"\({name} ", forward):
            lines.append(f"(defparam {name} {instance})")
    precision = rng.choice([":f32", ":bf16", ":bf16"])
    arguments = ["x", "ids"] + (["keep"] if re.search(r"\bkeep\b", forward) else [])
    lines += [
        f"(defun helper (x &key (k 0.5)) {helper})",
        f"(defun forward ({' '.join(arguments)}) {forward})",
        f"(defrun train :precision {precision})",
    ]
    return "\n".join(lines) + "\n", {"forward": arguments, "helper": ["x"]}


# Weights of the convolutions (channels 2 of length D; 1 of B x D) and of two experts.
TENSOR_PARAMS = [
    ("wc", "[2 2 3]"),
    ("wk", "[1 1 3 3]"),
    ("wr", "[d 2]"),
    ("gu", "[2 4 d]"),
    ("dn", "[2 d 2]"),
]
# The library's layers on rows [B d] (docs/LANGUAGE.md, "The layer library").
LAYERS = [
    ("lin", "(Linear d d)"),
    ("lin-nb", "(Linear d d :bias false)"),
    ("norm", "(LayerNorm d)"),
    ("rms", "(RMSNorm d :eps 1e-5)"),
]
STACKS = [
    "(stack 2 (blk :d d))",
    "(stack (i 2) (blk :d d :idx i))",
    "(stack (i (len widths)) (blk :d (at widths i) :idx i))",
]


def _blk_body(g: Gen) -> str:
    g.budget = 6
    scope = Scope({ROWS: ["x"]}, {MAT: ["w"]}, calls=False, smooth=True, keys=("k",))
    scope.conditions = ("(= idx 1)", "(< idx 1)", "(= d 4)", "(in idx odd)")
    body = g.expr(ROWS, scope, 3)
    return f"(if (= idx 1) (* {body} k) {body})" if g.chance(0.2) else body
