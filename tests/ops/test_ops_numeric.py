"""Every op of the registry, compiled under :f32, against torch reference values.

CASES maps each op name to one or more (arguments, body, inputs, reference)
cases. The tests iterate over the registry, so an op registered without a case
here fails `test_every_registered_op_has_a_case` and its own parametrized test;
a case for an op not registered yet is skipped.

A reference written as the same torch call the op means is compared bitwise.
Where the reference is torch's own fused function for a composite op
(layer-norm, batch-norm, attention, the scans), its evaluation order differs
from the op's definition, so those compare with a tolerance (see `tolerance`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

import pytest
import torch
import torch.nn.functional as F

from sx2torch.ops import REGISTRY


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def x34(seed=0):
    return torch.randn(3, 4, generator=_generator(seed))


def positive34(seed=0):
    return torch.rand(3, 4, generator=_generator(seed)) + 0.5


IDS = torch.tensor([2, 0, 1, 2])
LABELS = torch.tensor([3, 0, 1])


@dataclass
class Case:
    args: str  # the defun's argument list
    body: str  # the defun's body
    inputs: Callable[[], tuple]
    reference: Callable
    tolerance: Optional[dict] = None  # None: bitwise
    why: str = ""  # why a tolerance is unavoidable
    xfail: Optional[str] = None  # a known bug, reported


def _vjp(f, at, g):
    """The gradient of `(f(at) * g).sum()` with respect to `at`, by torch.autograd."""
    at = at.detach().requires_grad_()
    (grad,) = torch.autograd.grad(f(at), at, g)
    return grad


def case(args, body, inputs, reference, **extra) -> Case:
    return Case(args, body, inputs, reference, **extra)


XY = lambda: (x34(0), x34(1))  # noqa: E731
X = lambda: (x34(0),)  # noqa: E731
POS = lambda: (positive34(0),)  # noqa: E731

FUSED = dict(rtol=1e-5, atol=1e-5)
SEED = 7


def seeded():
    """x, then the global generator seeded: the module's draws follow (it has no parameters)."""
    x = x34(0)
    torch.manual_seed(SEED)
    return (x,)


def drawn(reference):
    """The reference's draws from the same seed."""
    return lambda *a: (torch.manual_seed(SEED), reference(*a))[1]


def _adjoint_loop(a, g):
    """l_t = g_t + A_{t+1}^T l_{t+1}, backwards over axis 1."""
    later, out = torch.zeros_like(g[:, 0]), []
    for t in reversed(range(g.shape[1])):
        step = g[:, t]
        if t + 1 < g.shape[1]:
            step = step + (a[:, t + 1].transpose(-1, -2) @ later.unsqueeze(-1)).squeeze(
                -1
            )
        later = step
        out.append(step)
    return torch.stack(out[::-1], 1)


def _linear_scan(a, b, axis=1):
    a, b = a.movedim(axis, 0), b.movedim(axis, 0)
    h, out = torch.zeros_like(b[0]), []
    for t in range(a.shape[0]):
        h = a[t] * h + b[t]
        out.append(h)
    return torch.stack(out).movedim(0, axis)


def _matrix_scan(a, b):
    """a: [batch time d d], b: [batch time d]; h_t = A_t h_{t-1} + b_t along axis 1."""
    h, out = torch.zeros_like(b[:, 0]), []
    for t in range(b.shape[1]):
        h = (a[:, t] @ h.unsqueeze(-1)).squeeze(-1) + b[:, t]
        out.append(h)
    return torch.stack(out, dim=1)


def _newton_schulz(g, steps=5):
    """Muon's quintic iteration, in bf16, returning f32 (6.8)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.to(torch.bfloat16)
    tall = g.shape[-2] > g.shape[-1]
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        m = x @ x.mT
        n = b * m + c * m @ m
        x = a * x + n @ x
    if tall:
        x = x.mT
    return x.float()


def _causal_attention(q, k, v):
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / d**0.5
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def _group_norm_backward(part: int, reference) -> Case:
    return case(
        "g x w",
        f"(group-norm-backward g x w :groups 2 :part {part})",
        lambda: tuple(
            torch.randn(shape, generator=_generator(seed))
            for seed, shape in enumerate([(2, 4, 3), (2, 4, 3), (4,)])
        ),
        reference,
        tolerance=FUSED,
        why="autograd's backward kernel against the differentiable form the helper runs "
        "(so that it can be differentiated again)",
    )


CASES: dict[str, list[Case]] = {
    "+": [
        case("x y", "(+ x y x)", XY, lambda x, y: x + y + x),
        case("x", "(+ x 1.5)", X, lambda x: x + 1.5),
    ],
    "*": [
        case("x y", "(* x y x)", XY, lambda x, y: x * y * x),
        case("x", "(* 2.0 x)", X, lambda x: 2.0 * x),
    ],
    "/": [
        case("x y", "(/ x y)", XY, lambda x, y: x / y),
        case("x", "(/ 1.0 x)", X, lambda x: 1.0 / x),
    ],
    "//": [case("x y", "(// x y)", XY, lambda x, y: x // y)],
    "positions": [case("x", "(positions x :axis 1)", X, lambda x: torch.arange(4))],
    "size": [case("x", "(* x (size x :axis 0))", X, lambda x: x * 3)],
    "len": [case("x", "(* x (len x))", X, lambda x: x * 3)],
    # made by a let of arithmetic on sizes: `n = x.shape[0] - 1`, read as a factor and a bound
    "run-number": [
        case(
            "x",
            "(let ((n (- (size x :axis 0) 1))) (slice (* x n) :axis 1 :end n))",
            X,
            lambda x: (x * 2)[:, :2],
        )
    ],
    "mod": [case("x y", "(mod x y)", XY, torch.remainder)],
    "dropout": [
        case("x", "(dropout x 0.25)", seeded, drawn(lambda x: F.dropout(x, 0.25)))
    ],
    "randn-like": [
        case(
            "x", "(+ x (randn-like x))", seeded, drawn(lambda x: x + torch.randn(3, 4))
        )
    ],
    "rand-like": [
        case("x", "(* x (rand-like x))", seeded, drawn(lambda x: x * torch.rand(3, 4)))
    ],
    "-": [
        case("x y", "(- x y)", XY, lambda x, y: x - y),
        case("x", "(- x)", X, lambda x: -x),
        case("x y", "(- x y x)", XY, lambda x, y: x - y - x),
    ],
    "neg": [case("x", "(neg x)", X, lambda x: -x)],
    "exp": [case("x", "(exp x)", X, torch.exp)],
    "log": [case("x", "(log x)", POS, torch.log)],
    "log1p": [case("x", "(log1p x)", POS, torch.log1p)],
    "expm1": [case("x", "(expm1 x)", X, torch.expm1)],
    "stack": [
        case("x y", "(stack [x y] :axis 1)", XY, lambda x, y: torch.stack([x, y], 1))
    ],
    "pad": [
        case("x", "(pad x [2 1 1 0])", X, lambda x: F.pad(x, (2, 1, 1, 0))),
        case(
            "x", "(pad x [-1 1] :value 2.5)", X, lambda x: F.pad(x, (-1, 1), value=2.5)
        ),
    ],
    "floor": [case("x", "(floor (* 3.0 x))", X, lambda x: torch.floor(3.0 * x))],
    "ceil": [case("x", "(ceil (* 3.0 x))", X, lambda x: torch.ceil(3.0 * x))],
    "int": [case("x", "(int (* 3.0 x))", X, lambda x: (3.0 * x).long())],
    "softplus": [
        case("x", "(softplus x)", X, F.softplus),
        case(
            "x",
            "(softplus (* x 40.0) :beta 2.0 :threshold 30)",
            X,
            lambda x: F.softplus(x * 40.0, beta=2.0, threshold=30),
        ),
    ],
    "sqrt": [case("x", "(sqrt x)", POS, torch.sqrt)],
    "rsqrt": [case("x", "(rsqrt x)", POS, torch.rsqrt)],
    "square": [case("x", "(square x)", X, torch.square)],
    "tanh": [case("x", "(tanh x)", X, torch.tanh)],
    "sigmoid": [case("x", "(sigmoid x)", X, torch.sigmoid)],
    "relu": [case("x", "(relu x)", X, torch.relu)],
    "silu": [case("x", "(silu x)", X, F.silu)],
    "sin": [case("x", "(sin x)", X, torch.sin)],
    "cos": [case("x", "(cos x)", X, torch.cos)],
    "abs": [case("x", "(abs x)", X, torch.abs)],
    "pow": [
        case("x", "(pow x 3)", X, lambda x: torch.pow(x, 3)),
        case("x y", "(pow x y)", lambda: (positive34(0), x34(1)), torch.pow),
    ],
    "maximum": [
        case("x y", "(maximum x y)", XY, torch.maximum),
        case(
            "x",
            "(maximum x 0.0)",
            X,
            lambda x: torch.clamp(x, min=0.0),
        ),
    ],
    "minimum": [case("x y", "(minimum x y)", XY, torch.minimum)],
    "where": [
        case("x y", "(where (> x 0) x y)", XY, lambda x, y: torch.where(x > 0, x, y)),
        case("x", "(where (> x 0) x 0.0)", X, lambda x: torch.where(x > 0, x, 0.0)),
    ],
    "<": [case("x y", "(< x y)", XY, torch.lt)],
    "<=": [case("x y", "(<= x y)", XY, torch.le)],
    ">": [
        case("x y", "(> x y)", XY, torch.gt),
        case("x", "(> x 0.5)", X, lambda x: x > 0.5),
    ],
    ">=": [case("x y", "(>= x y)", XY, torch.ge)],
    "=": [case("x", "(= (square x) (* x x))", X, lambda x: torch.square(x) == x * x)],
    "clamp": [
        case(
            "x", "(clamp x :min -0.5 :max 0.5)", X, lambda x: torch.clamp(x, -0.5, 0.5)
        ),
        case("x", "(clamp x :max 0.25)", X, lambda x: torch.clamp(x, max=0.25)),
    ],
    "sum": [
        case("x", "(sum x)", X, torch.sum),
        case(
            "x",
            "(sum x :axes [1] :keepdims true)",
            X,
            lambda x: torch.sum(x, dim=1, keepdim=True),
        ),
    ],
    "mean": [
        case("x", "(mean x :axes [0])", X, lambda x: torch.mean(x, dim=0)),
        case("x", "(mean x :axes [0 1])", X, lambda x: torch.mean(x, dim=(0, 1))),
    ],
    "amax": [
        case("x", "(amax x)", X, torch.amax),
        case(
            "x",
            "(amax x :keepdims true)",
            X,
            lambda x: torch.amax(x, dim=(0, 1), keepdim=True),
        ),
    ],
    "amin": [case("x", "(amin x :axes [-1])", X, lambda x: torch.amin(x, dim=-1))],
    "matmul": [
        case(
            "x w",
            "(matmul x w)",
            lambda: (x34(0), torch.randn(4, 5, generator=_generator(1))),
            torch.matmul,
        ),
        case(
            "x w",
            "(matmul x w :out :f32)",
            lambda: (
                torch.randn(2, 3, 4, generator=_generator(0)),
                torch.randn(4, 5, generator=_generator(1)),
            ),
            torch.matmul,
        ),
    ],
    "softmax": [case("x", "(softmax x)", X, lambda x: torch.softmax(x, dim=-1))],
    "log-softmax": [
        case("x", "(log-softmax x :axis 0)", X, lambda x: torch.log_softmax(x, dim=0))
    ],
    "logsumexp": [
        case("x", "(logsumexp x :axes [-1])", X, lambda x: torch.logsumexp(x, dim=-1)),
        case("x", "(logsumexp x)", X, lambda x: torch.logsumexp(x, dim=(0, 1))),
    ],
    "cross-entropy": [
        case(
            "x labels",
            "(cross-entropy x labels)",
            lambda: (x34(0), LABELS),
            F.cross_entropy,
        ),
        case(
            "x labels",
            "(cross-entropy x labels :reduction :sum)",
            lambda: (x34(0), LABELS),
            lambda x, labels: F.cross_entropy(x, labels, reduction="sum"),
        ),
        case(
            "x labels",
            "(cross-entropy x labels :reduction :none)",
            lambda: (x34(0), LABELS),
            lambda x, labels: F.cross_entropy(x, labels, reduction="none"),
        ),
    ],
    "softcap": [case("x", "(softcap x 2.0)", X, lambda x: 2.0 * torch.tanh(x / 2.0))],
    "gelu": [
        case("x", "(gelu x)", X, F.gelu),
        case(
            "x",
            "(gelu x :approximate :tanh)",
            X,
            lambda x: F.gelu(x, approximate="tanh"),
        ),
    ],
    "fused-layer-norm": [
        case("x", "(fused-layer-norm x)", X, lambda x: F.layer_norm(x, (4,))),
        case(
            "x y",
            "(fused-layer-norm x (sum y :axes [0]) (amax y :axes [0]) :eps 1e-3)",
            XY,
            lambda x, y: F.layer_norm(x, (4,), y.sum(0), y.amax(0), eps=1e-3),
        ),
    ],
    "group-norm": [
        case(
            "x",
            "(group-norm (reshape x [1 4 3]) 2)",
            X,
            lambda x: F.group_norm(x.reshape(1, 4, 3), 2),
        ),
        case(
            "x y",
            "(group-norm (reshape x [3 2 2]) 1 (sum y :axes [1]) (amax y :axes [1]) "
            ":eps 1e-3)",
            lambda: (x34(0), torch.randn(2, 3, generator=_generator(1))),
            lambda x, y: F.group_norm(
                x.reshape(3, 2, 2), 1, y.sum(1), y.amax(1), eps=1e-3
            ),
        ),
    ],
    "group-norm-backward": [
        _group_norm_backward(
            0, lambda g, x, w: _vjp(lambda x: F.group_norm(x, 2, w), x, g)
        ),
        _group_norm_backward(
            1, lambda g, x, w: _vjp(lambda w: F.group_norm(x, 2, w), w, g)
        ),
        _group_norm_backward(2, lambda g, x, w: g.sum((0, 2))),
    ],
    "fused-rms-norm": [
        case("x", "(fused-rms-norm x)", X, lambda x: F.rms_norm(x, (4,))),
        case(
            "x y",
            "(fused-rms-norm x (sum y :axes [0]) :eps 1e-3)",
            XY,
            lambda x, y: F.rms_norm(x, (4,), weight=y.sum(0), eps=1e-3),
        ),
    ],
    "linear": [
        case("x y", "(linear x y)", XY, F.linear),
        case(
            "x y",
            "(linear x y (sum y :axes [1]))",
            XY,
            lambda x, y: F.linear(x, y, y.sum(1)),
        ),
    ],
    "attention": [
        case(
            "q k v",
            "(attention q k v :causal true :scale 0.3)",
            lambda: tuple(
                torch.randn(2, 3, 5, 4, generator=_generator(s)) for s in range(3)
            ),
            lambda q, k, v: F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=0.3
            ),
        ),
        case(
            "q k v",
            "(attention q k v :window 1)",
            lambda: tuple(
                torch.randn(2, 3, 5, 4, generator=_generator(s)) for s in range(3)
            ),
            lambda q, k, v: F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=torch.ones(5, 5, dtype=torch.bool).tril()
                & torch.ones(5, 5, dtype=torch.bool).triu(-1),
            ),
        ),
    ],
    "arange-of": [
        case("x", "(arange-of x :axis 0)", X, lambda x: torch.arange(3.0)),
        case("x", "(arange-of x)", X, lambda x: torch.arange(4.0)),
    ],
    "arange": [
        case("x", "(arange x 0 16 2)", X, lambda x: torch.arange(0.0, 16.0, 2.0)),
        case("x", "(arange x 3 10 4)", X, lambda x: torch.tensor([3.0, 7.0])),
    ],
    "linspace": [
        case("x", "(linspace x -1.0 2.0 7)", X, lambda x: torch.linspace(-1, 2, 7))
    ],
    "rms-norm": [
        # The seed's definition, bitwise.
        case(
            "x",
            "(rms-norm x)",
            X,
            lambda x: x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-6),
        ),
        case(
            "x",
            "(rms-norm x :eps 1e-3)",
            X,
            lambda x: F.rms_norm(x, (4,), eps=1e-3),
            tolerance=FUSED,
            why="F.rms_norm is a fused kernel with its own evaluation order",
        ),
    ],
    "layer-norm": [
        case(
            "x",
            "(layer-norm x)",
            X,
            lambda x: F.layer_norm(x, (4,), eps=1e-5),
            tolerance=FUSED,
            why="F.layer_norm computes its statistics in another order (Welford)",
        )
    ],
    "batch-norm": [
        case(
            "x",
            "(batch-norm x)",
            X,
            lambda x: F.batch_norm(x, None, None, training=True, eps=1e-5),
            tolerance=FUSED,
            why="F.batch_norm computes its statistics in another order (Welford)",
        ),
        case(
            "x",
            "(batch-norm x :axes [0 1])",
            lambda: (torch.randn(2, 3, 4, generator=_generator(0)),),
            lambda x: F.batch_norm(
                x.permute(0, 2, 1), None, None, training=True, eps=1e-5
            ).permute(0, 2, 1),
            tolerance=FUSED,
            why="F.batch_norm computes its statistics in another order (Welford)",
        ),
    ],
    "reshape": [
        case("x", "(reshape x [2 -1])", X, lambda x: x.reshape(2, 6)),
        case("x", "(reshape x [0 2 -1])", X, lambda x: x.reshape(3, 2, 2)),
    ],
    "transpose": [
        case(
            "x",
            "(transpose (reshape x [3 2 2]) [2 0 1])",
            X,
            lambda x: x.reshape(3, 2, 2).permute(2, 0, 1),
        )
    ],
    "swap-axes": [case("x", "(swap-axes x 0 1)", X, lambda x: x.transpose(0, 1))],
    "concat": [
        case(
            "x y",
            "(concat [x y x] :axis 1)",
            XY,
            lambda x, y: torch.cat([x, y, x], dim=1),
        )
    ],
    "slice": [
        case("x", "(slice x :axis -1 :start 1 :end 3)", X, lambda x: x[..., 1:3]),
        case("x", "(slice x :axis 0 :start 1 :end 3)", X, lambda x: x[1:3]),
        case("x", "(slice x :axis -1 :step 2)", X, lambda x: x[..., 0::2]),
        case(
            "x", "(slice x :axis 1 :start 1 :end 4 :step 2)", X, lambda x: x[:, 1:4:2]
        ),
    ],
    "at": [case("x", "(at x 2)", lambda: (x34(0)[0],), lambda x: x[2])],
    "take": [
        case("x ids", "(take x ids)", lambda: (x34(0), IDS), lambda x, ids: x[ids])
    ],
    # routing (sx2torch/ops/routing.py): indices are int64, as torch gives them
    "topk": [
        case("x", "(let (([v i] (topk x 2))) v)", X, lambda x: torch.topk(x, 2).values),
        case(
            "x",
            "(let (([v i] (topk x 3 :sorted false))) v)",
            X,
            lambda x: torch.topk(x, 3, sorted=False).values,
        ),
        case(
            "x",
            "(let (([v i] (topk x 2 :axis 0))) i)",
            X,
            lambda x: torch.topk(x, 2, dim=0).indices,
        ),
        case(  # ties: torch.topk's own choice among equal values
            "x",
            "(let (([v i] (topk x 2))) i)",
            lambda: (
                torch.tensor([[1.0, 2.0, 2.0, 1.0], [0.0] * 4, [3.0, 1.0, 3.0, 3.0]]),
            ),
            lambda x: torch.topk(x, 2).indices,
        ),
    ],
    "topk-indices": [
        case("x", "(topk-indices x :k 3)", X, lambda x: torch.topk(x, 3).indices)
    ],
    "argmax": [
        case("x", "(argmax x)", X, lambda x: torch.argmax(x, dim=-1)),
        case("x", "(argmax x :axis 0)", X, lambda x: torch.argmax(x, dim=0)),
    ],
    "gather": [
        case(
            "x i",
            "(gather x i)",
            lambda: (x34(0), torch.tensor([[0, 3], [1, 1], [2, 0]])),
            lambda x, i: torch.gather(x, -1, i),
        )
    ],
    "index-select": [
        case(
            "x i",
            "(index-select x i)",
            lambda: (x34(0), torch.tensor([2, 0, 2, 1])),
            lambda x, i: x[i],
        )
    ],
    "scatter-add": [
        case(
            "x i s",
            "(scatter-add x i s)",
            lambda: (x34(0), torch.tensor([[0, 0], [3, 1], [2, 2]]), x34(1)[:, :2]),
            lambda x, i, s: x.scatter_add(-1, i, s),
        )
    ],
    "index-add": [
        case(
            "x i s",
            "(index-add x i s)",
            lambda: (x34(0), torch.tensor([2, 0, 2]), x34(1)),
            lambda x, i, s: x.index_add(0, i, s),
        )
    ],
    "sparse-experts": [
        case(
            "x i w gu dn",
            "(sparse-experts x i w gu dn)",
            lambda: (
                torch.randn(5, 4, generator=_generator(0)),
                torch.tensor([[0, 2], [2, 1], [0, 1], [2, 0], [1, 2]]),
                torch.rand(5, 2, generator=_generator(1)),
                torch.randn(3, 6, 4, generator=_generator(2)),
                torch.randn(3, 4, 3, generator=_generator(3)),
            ),
            lambda x, i, w, gu, dn: sum(  # every row through each expert, kept where chosen
                (
                    (F.silu(x @ gu[e, :3].T) * (x @ gu[e, 3:].T))
                    @ dn[e].T
                    * (w * (i == e)).sum(-1, keepdim=True)
                )
                for e in range(3)
            ),
            tolerance=dict(rtol=1e-6, atol=1e-6),
            why="the reference adds the three experts' zeros and products in its own order",
        )
    ],
    "cumsum": [
        case("x", "(cumsum x)", X, lambda x: torch.cumsum(x, dim=-1)),
        case("x", "(cumsum x :axis 0)", X, lambda x: torch.cumsum(x, dim=0)),
    ],
    "one-hot": [
        case(
            "ids",
            "(one-hot ids 5)",
            lambda: (IDS,),
            lambda ids: F.one_hot(ids, 5).float(),
        )
    ],
    "erf": [case("x", "(erf x)", X, torch.erf)],
    # Ops the derivative rules build backward sweeps from (usable in source too).
    "ones-like": [case("x", "(ones-like x)", X, torch.ones_like)],
    "zeros-like": [case("x", "(zeros-like x)", X, torch.zeros_like)],
    "mean-ones": [
        case("x", "(mean-ones x)", X, lambda x: torch.ones_like(x) / x.numel())
    ],
    "matmul-ones": [
        case(
            "x w",
            "(matmul-ones x (transpose w [1 0]))",
            XY,
            lambda x, w: torch.ones_like(x @ w.T),
        )
    ],
    "sum-to": [
        case(
            "g x",
            "(sum-to g (slice x :axis 0 :start 0 :end 1))",
            XY,
            lambda g, x: g.sum(0, keepdim=True),
        )
    ],
    "expand-as": [
        case(
            "g x",
            "(expand-as (slice g :axis 0 :start 0 :end 1) x)",
            XY,
            lambda g, x: g[0:1].expand(3, 4),
        )
    ],
    "expand-reduced": [
        case(
            "g x",
            "(expand-reduced (sum g :axes [1]) x :axes [1])",
            XY,
            lambda g, x: g.sum(1, keepdim=True).expand(3, 4),
        ),
        case(
            "g x",
            "(expand-reduced (sum g :axes [0]) x :axes [0] :mean true)",
            XY,
            lambda g, x: g.sum(0, keepdim=True).expand(3, 4) / 3.0,
        ),
    ],
    "cross-entropy-backward": [
        case(
            "g logits labels",
            "(cross-entropy-backward g logits labels)",
            lambda: (torch.tensor(0.5), x34(0), torch.tensor([0, 3, 1])),
            lambda g, logits, labels: (torch.softmax(logits, -1) - F.one_hot(labels, 4))
            * (g / 3),
            tolerance=FUSED,
            why="softmax is fused; the reference's order of operations may differ in the last bit",
        )
    ],
    "linear-scan-adjoint": [
        case(
            "a g",
            "(linear-scan-adjoint a g :axis 1)",
            lambda: (torch.sigmoid(x34(0)).reshape(2, 6, 1), x34(1).reshape(2, 6, 1)),
            lambda a, g: _linear_scan(
                torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], 1).flip(1), g.flip(1)
            ).flip(1),
            tolerance=FUSED,
            why="the parallel scan sums in another order than the loop",
        )
    ],
    "matrix-scan-adjoint": [
        case(
            "a g",
            "(matrix-scan-adjoint a g :axis 1)",
            lambda: (
                (x34(0) * 0.3).reshape(1, 3, 2, 2),
                x34(1)[:, :2].reshape(1, 3, 2),
            ),
            lambda a, g: _adjoint_loop(a, g),
            tolerance=FUSED,
            why="the parallel scan sums in another order than the loop",
        )
    ],
    "unsqueeze": [
        case("x", "(unsqueeze x :axis 1)", X, lambda x: x.unsqueeze(1)),
        case("x", "(unsqueeze x :axis -1)", X, lambda x: x.unsqueeze(-1)),
    ],
    "contiguous": [
        case("x", "(contiguous (swap-axes x 0 1))", X, lambda x: x.t().contiguous()),
    ],
    "squeeze": [
        case("x", "(squeeze (reshape x [3 1 4]) :axis 1)", X, lambda x: x),
        case("x", "(squeeze (reshape x [1 3 1 4]))", X, lambda x: x),
    ],
    "flatten": [
        case("x", "(flatten x)", X, torch.flatten),
        case(
            "x",
            "(flatten (reshape x [3 2 2]) :start 1)",
            X,
            lambda x: x.reshape(3, 2, 2).flatten(1),
        ),
        case(
            "x",
            "(flatten (reshape x [3 2 2 1]) :start 1 :end 2)",
            X,
            lambda x: x.reshape(3, 2, 2, 1).flatten(1, 2),
        ),
    ],
    "repeat-interleave": [
        case(
            "x",
            "(repeat-interleave x :repeats 2 :axis 1)",
            X,
            lambda x: x.repeat_interleave(2, dim=1),
        ),
        case(
            "x", "(repeat-interleave x :repeats 3)", X, lambda x: x.repeat_interleave(3)
        ),
    ],
    "repeat-interleave-backward": [
        case(
            "g x",
            "(repeat-interleave-backward g x :repeats 2 :axis -1)",
            lambda: (torch.randn(3, 8, generator=_generator(0)), x34(1)),
            lambda g, x: _vjp(lambda x: x.repeat_interleave(2, dim=-1), x, g),
        ),
        case(
            "g x",
            "(repeat-interleave-backward g x :repeats 3)",
            lambda: (torch.randn(36, generator=_generator(0)), x34(1)),
            lambda g, x: _vjp(lambda x: x.repeat_interleave(3), x, g),
        ),
    ],
    "roll": [
        case("x", "(roll x :shifts 1 :axis 1)", X, lambda x: torch.roll(x, 1, 1)),
        case("x", "(roll x :shifts -5)", X, lambda x: torch.roll(x, -5)),
    ],
    "previous": [
        case(
            "h",
            "(previous h :axis 1)",
            X,
            lambda h: torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1),
        )
    ],
    "outer": [
        case("x y", "(outer x y)", XY, lambda x, y: x.unsqueeze(-1) * y.unsqueeze(-2))
    ],
    "einsum": [
        case(
            "x y",
            '(einsum "ij,kj->ik" x y)',
            XY,
            lambda x, y: torch.einsum("ij,kj->ik", x, y),
        )
    ],
    "take-backward": [
        case(
            "g table ids",
            "(take-backward g table ids)",
            lambda: (torch.randn(4, 4, generator=_generator(0)), x34(1), IDS),
            lambda g, table, ids: torch.zeros_like(table).index_add(0, ids, g),
        )
    ],
    "slice-backward": [
        case(
            "g x",
            "(slice-backward (slice g :axis 1 :start 1 :end 3) x :axis 1 :start 1 :end 3)",
            XY,
            lambda g, x: F.pad(g[:, 1:3], (1, 1)),
        ),
        case(
            "g x",
            "(slice-backward (slice g :axis -1 :start 1 :step 2) x :axis -1 :start 1 :step 2)",
            XY,
            lambda g, x: _vjp(lambda x: x[..., 1::2], x, g[..., 1::2]),
        ),
    ],
    "rms-norm-backward": [
        case(
            "g x",
            "(rms-norm-backward g x)",
            XY,
            lambda g, x: _vjp(lambda x: F.rms_norm(x, (4,)), x, g),
            tolerance=FUSED,
            why="the reference is autograd's backward: its order of operations differs",
        ),
        case(
            "g x w",
            "(rms-norm-backward g x (sum w :axes [0]) :eps 1e-3)",
            lambda: (x34(0), x34(1), x34(2)),
            lambda g, x, w: _vjp(
                lambda x: F.rms_norm(x, (4,), weight=w.sum(0), eps=1e-3), x, g
            ),
            tolerance=FUSED,
            why="the reference is autograd's backward: its order of operations differs",
        ),
    ],
    "rms-norm-weight-backward": [
        case(
            "g x",
            "(rms-norm-weight-backward g x)",
            XY,
            lambda g, x: _vjp(
                lambda w: F.rms_norm(x, (4,), weight=w), torch.ones(4), g
            ),
            tolerance=FUSED,
            why="the reference is autograd's backward: its order of operations differs",
        ),
    ],
    "concat-part": [
        case("x", "(concat-part x x :index 0 :axis 1)", X, lambda x: x),
        case(
            "x y",
            "(concat-part (concat [x y] :axis 1) x y :index 1 :axis 1)",
            XY,
            lambda x, y: y,
        ),
    ],
    "reshape-as": [
        case(
            "x y", "(reshape-as x (reshape y [2 6]))", XY, lambda x, y: x.reshape(2, 6)
        )
    ],
    "causal-mask": [
        case(
            "x",
            "(causal-mask x)",
            lambda: (torch.randn(2, 3, 5, generator=_generator(0)),),
            lambda x: x.masked_fill(
                torch.ones(3, 5, dtype=torch.bool).triu(1), float("-inf")
            ),
        )
    ],
    "attention-scale": [
        case(
            "s q",
            "(attention-scale s q)",
            lambda: (x34(0), torch.randn(3, 9, generator=_generator(1))),
            lambda s, q: s * 9**-0.5,
        )
    ],
    "newton-schulz-bf16": [
        case(
            "g",
            "(newton-schulz-bf16 g)",
            lambda: (torch.randn(6, 4, generator=_generator(0)),),
            _newton_schulz,  # the iteration in bf16, cast back to the input's dtype
        )
    ],
    "eager-attention": [
        case(
            "q k v",
            "(eager-attention q k v (* 0.5 q) :scale 0.3)",
            lambda: tuple(
                torch.randn(2, 3, 4, 4, generator=_generator(s)) for s in range(3)
            ),
            lambda q, k, v: torch.softmax(q @ k.mT * 0.3 + 0.5 * q, -1) @ v,
        )
    ],
    "causal-attention": [
        case(
            "q k v",
            "(causal-attention q k v)",
            lambda: tuple(
                torch.randn(2, 3, 5, 4, generator=_generator(s)) for s in range(3)
            ),
            _causal_attention,
            tolerance=FUSED,
            why="the op may use a fused attention kernel",
        )
    ],
    "scalar-like": [
        case("x", "(* x (scalar-like x 0.1))", X, lambda x: x * torch.tensor(0.1)),
        case("x", "(scalar-like x (sqrt 48))", X, lambda x: torch.tensor(48**0.5)),
    ],
    "cast-run": [case("x", "(cast-run x)", X, lambda x: x)],
    "linear-scan": [
        case(
            "a b",
            "(linear-scan a b)",
            lambda: (
                torch.rand(2, 6, 3, generator=_generator(0)),
                torch.randn(2, 6, 3, generator=_generator(1)),
            ),
            _linear_scan,
            tolerance=FUSED,
            why="a scan may associate its products in another order than the loop",
        )
    ],
    "matrix-scan": [
        case(
            "a b",
            "(matrix-scan a b)",
            lambda: (
                0.5 * torch.randn(2, 6, 3, 3, generator=_generator(0)),
                torch.randn(2, 6, 3, generator=_generator(1)),
            ),
            _matrix_scan,
            tolerance=FUSED,
            why="a scan may associate its products in another order than the loop",
        )
    ],
    "newton-schulz": [
        case(
            "g",
            "(newton-schulz g)",
            lambda: (torch.randn(6, 4, generator=_generator(0)),),
            _newton_schulz,
            tolerance=dict(rtol=0.0, atol=0.02),
            why="bf16 iterations: the grouping of the polynomial changes bf16 roundings",
        )
    ],
}


def _implemented(name: str) -> bool:
    op = REGISTRY.get(name)
    return op is not None and (op.emit is not None or op.expand is not None)


# Ops whose attributes only the compiler writes, tested where it writes them, and ops with
# their own file of numeric tests on every target.
TESTED_ELSEWHERE = {
    "expect-scalar": "tests/gradient/test_scalar_y.py",
    "cast-bool": "tests/ops/test_integers.py",  # made by (cast x :bool)
    # made by the cache pass of a :generate run, never from source: the generated modules'
    # cached steps against their whole-prefix forward and against transformers
    **dict.fromkeys(
        ("cached-attention", "cached-arange-of", "cached-positions", "last-position"),
        "tests/runtime/test_generate.py, tests/models/test_generate.py",
    ),
    # recurrent states against re-running the prefix and transformers' Mamba
    **dict.fromkeys(
        ("cached-conv1d", "cached-linear-scan"),
        "tests/runtime/test_cache_states.py, tests/models/test_generate_mamba.py",
    ),
    # attention written out, against transformers' eager GPT-2 and re-running the prefix
    **dict.fromkeys(
        ("cached-matmul", "cached-causal-mask"),
        "tests/models/test_generate_written.py",
    ),
    **dict.fromkeys(
        (
            "conv1d",
            "conv2d",
            "conv1d-input-grad",
            "conv1d-weight-grad",
            "conv2d-input-grad",
            "conv2d-weight-grad",
            "max-pool1d",
            "max-pool2d",
            "avg-pool1d",
            "avg-pool2d",
            "interpolate",
        ),
        "tests/ops/test_conv_ops.py",
    ),
    **dict.fromkeys(
        ("conv-transpose1d", "conv-transpose2d"), "tests/ops/test_conv_transpose.py"
    ),
}


ALL_OPS = sorted((set(REGISTRY) | set(CASES)) - set(TESTED_ELSEWHERE))


def test_every_registered_op_has_a_case():
    missing = sorted(
        name
        for name in REGISTRY
        if _implemented(name) and name not in CASES and name not in TESTED_ELSEWHERE
    )
    assert not missing, f"ops without a numeric test: {missing}; add them to CASES"


def _params():
    for name in ALL_OPS:
        cases = CASES.get(name, [None])
        for index, c in enumerate(cases):
            marks = (
                [pytest.mark.xfail(strict=True, reason=c.xfail)]
                if c and c.xfail
                else []
            )
            yield pytest.param(name, index, id=f"{name}-{index}", marks=marks)


@pytest.mark.parametrize("name, index", list(_params()))
def test_op_against_torch(build, monkeypatch, name, index):
    if not _implemented(name):
        pytest.skip(f"{name} is not registered yet")
    if REGISTRY[
        name
    ].internal:  # made by derivative rules; called from source only here
        monkeypatch.setitem(REGISTRY, name, replace(REGISTRY[name], internal=False))
    assert name in CASES, f"{name} is registered but has no case in CASES"
    c = CASES[name][index]
    module, code = build(f"(defun forward ({c.args}) {c.body})\n", "m.lisp")
    inputs = c.inputs()
    got = module.M()(*inputs)
    expected = c.reference(*inputs)
    assert got.dtype == expected.dtype and got.shape == expected.shape, code
    if c.tolerance is None:
        assert torch.equal(got, expected), f"{got}\n!=\n{expected}\n{code}"
    else:
        assert c.why
        torch.testing.assert_close(got, expected, **c.tolerance)
