"""Each derivative rule against torch.autograd of an independent reference, in float64 terms.

Every source below computes `(gradient (sum (* (OP ...) c)) x)`, so the rule sees a
non-uniform output gradient `c`; the reference is torch.autograd.grad of the same sum,
written in plain PyTorch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sx2torch.ops import REGISTRY

X_SHAPE = (3, 4)

# name: (the op applied to x (and y), reference, needs positive x)
UNARY = {
    "neg": ("(neg x)", torch.neg, False),
    "exp": ("(exp x)", torch.exp, False),
    "log": ("(log x)", torch.log, True),
    "log1p": ("(log1p x)", torch.log1p, True),
    "expm1": ("(expm1 x)", torch.expm1, False),
    "softplus": ("(softplus x)", F.softplus, False),
    # beta x on both sides of the threshold: the linear side passes the gradient on
    "softplus-beta": (
        "(softplus (* x 8.0) :beta 2.0 :threshold 4)",
        lambda x: F.softplus(x * 8.0, beta=2.0, threshold=4),
        False,
    ),
    "sqrt": ("(sqrt x)", torch.sqrt, True),
    "rsqrt": ("(rsqrt x)", torch.rsqrt, True),
    "tanh": ("(tanh x)", torch.tanh, False),
    "sigmoid": ("(sigmoid x)", torch.sigmoid, False),
    "sin": ("(sin x)", torch.sin, False),
    "cos": ("(cos x)", torch.cos, False),
    "erf": ("(erf x)", torch.erf, False),
    "abs": ("(abs x)", torch.abs, False),
    "relu": ("(relu x)", torch.relu, False),
    "gelu": ("(gelu x)", F.gelu, False),
    "gelu-tanh": (
        "(gelu x :approximate :tanh)",
        lambda x: F.gelu(x, approximate="tanh"),
        False,
    ),
    "silu": ("(silu x)", F.silu, False),
    "cast-run": ("(cast-run x)", lambda x: x, False),
    # the number carries no gradient: d(x * 0.5)/dx
    "scalar-like": ("(* x (scalar-like x 0.5))", lambda x: x * 0.5, False),
    "square": ("(square x)", torch.square, False),
    "pow": ("(pow x 3.0)", lambda x: x**3.0, False),
    "clamp": (
        "(clamp x :min -0.5 :max 0.5)",
        lambda x: torch.clamp(x, -0.5, 0.5),
        False,
    ),
    "sum": (
        "(sum x :axes [1] :keepdims true)",
        lambda x: x.sum(1, keepdim=True),
        False,
    ),
    "mean": ("(mean x :axes [0])", lambda x: x.mean(0), False),
    "amax": (
        "(amax x :axes [-1] :keepdims true)",
        lambda x: x.amax(-1, keepdim=True),
        False,
    ),
    "amin": ("(amin x)", lambda x: x.amin(), False),
    "reshape": ("(reshape x [2 -1])", lambda x: x.reshape(2, -1), False),
    "transpose": (
        "(transpose (reshape x [3 2 2]) [2 0 1])",
        lambda x: x.reshape(3, 2, 2).permute(2, 0, 1),
        False,
    ),
    "swap-axes": ("(swap-axes x 0 1)", lambda x: x.transpose(0, 1), False),
    "slice": ("(slice x :axis 1 :start 1 :end 3)", lambda x: x[:, 1:3], False),
    "slice-step": (
        "(slice x :axis -1 :start 1 :step 2)",
        lambda x: x[..., 1::2],
        False,
    ),
    "unsqueeze": ("(unsqueeze x :axis 1)", lambda x: x.unsqueeze(1), False),
    "contiguous": (
        "(contiguous (swap-axes x 0 1))",
        lambda x: x.transpose(0, 1).contiguous(),
        False,
    ),
    "squeeze": (
        "(squeeze (reshape x [3 1 4]) :axis 1)",
        lambda x: x.reshape(3, 1, 4).squeeze(1),
        False,
    ),
    "flatten": (
        "(flatten (reshape x [3 2 2]) :start 1)",
        lambda x: x.reshape(3, 2, 2).flatten(1),
        False,
    ),
    "repeat-interleave": (
        "(repeat-interleave x :repeats 3 :axis 0)",
        lambda x: x.repeat_interleave(3, dim=0),
        False,
    ),
    "repeat-interleave-flat": (
        "(repeat-interleave x :repeats 2)",
        lambda x: x.repeat_interleave(2),
        False,
    ),
    "roll": ("(roll x :shifts 3 :axis -1)", lambda x: torch.roll(x, 3, -1), False),
    "roll-flat": ("(roll x :shifts -2)", lambda x: torch.roll(x, -2), False),
    "stack": (
        "(stack [x (exp x)] :axis -1)",
        lambda x: torch.stack([x, x.exp()], -1),
        False,
    ),
    "pad": (
        "(pad x [1 2 -1 1] :value 0.5)",
        lambda x: F.pad(x, (1, 2, -1, 1), value=0.5),
        False,
    ),
    "floor": ("(floor (* 3.0 x))", lambda x: torch.floor(3.0 * x), False),
    "einsum": (
        '(einsum "ij,kj->ik" x (exp x))',
        lambda x: torch.einsum("ij,kj->ik", x, x.exp()),
        False,
    ),
    "ceil": ("(ceil (* 3.0 x))", lambda x: torch.ceil(3.0 * x), False),
    "eager-attention": (
        "(eager-attention x (exp x) x :scale 0.5)",
        lambda x: torch.softmax(x @ x.exp().mT * 0.5, -1) @ x,
        False,
    ),
    "concat": (
        "(concat [x (exp x)] :axis 1)",
        lambda x: torch.cat([x, x.exp()], 1),
        False,
    ),
    "softmax": ("(softmax x)", lambda x: torch.softmax(x, -1), False),
    "log-softmax": (
        "(log-softmax x :axis 0)",
        lambda x: torch.log_softmax(x, 0),
        False,
    ),
    "logsumexp": ("(logsumexp x :axes [1])", lambda x: torch.logsumexp(x, 1), False),
    "softcap": ("(softcap x 2.0)", lambda x: 2.0 * torch.tanh(x / 2.0), False),
    "rms-norm": (
        "(rms-norm x)",
        lambda x: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6),
        False,
    ),
    "layer-norm": ("(layer-norm x)", lambda x: F.layer_norm(x, (4,), eps=1e-5), False),
    "fused-rms-norm": ("(fused-rms-norm x)", lambda x: F.rms_norm(x, (4,)), False),
    "group-norm": (
        "(group-norm (reshape x [3 2 2]) 2)",
        lambda x: F.group_norm(x.reshape(3, 2, 2), 2),
        False,
    ),
    "fused-layer-norm": (
        "(fused-layer-norm x)",
        lambda x: F.layer_norm(x, (4,)),
        False,
    ),
    "causal-attention": (
        "(causal-attention (reshape x [1 3 4]) (reshape (exp x) [1 3 4]) (reshape (sin x) [1 3 4]))",
        lambda x: F.scaled_dot_product_attention(
            x.reshape(1, 3, 4),
            x.exp().reshape(1, 3, 4),
            x.sin().reshape(1, 3, 4),
            is_causal=True,
        ),
        False,
    ),
    "linear-scan": (
        "(linear-scan (sigmoid (reshape x [3 4 1])) (reshape (exp x) [3 4 1]) :axis 1)",
        lambda x: _linear_scan_loop(
            torch.sigmoid(x.reshape(3, 4, 1)), x.exp().reshape(3, 4, 1)
        ),
        False,
    ),
    "matrix-scan": (
        "(matrix-scan (reshape (* x 0.3) [1 3 2 2]) (reshape (slice x :axis 1 :start 0 :end 2) [1 3 2]) :axis 1)",
        lambda x: _matrix_scan_loop(
            (x * 0.3).reshape(1, 3, 2, 2), x[:, 0:2].reshape(1, 3, 2)
        ),
        False,
    ),
    "batch-norm": (
        "(batch-norm x)",
        lambda x: (x - x.mean(0, keepdim=True))
        * torch.rsqrt(x.var(0, unbiased=False, keepdim=True) + 1e-5),
        False,
    ),
}
BINARY = {
    "+": ("(+ x y)", torch.add),
    "-": ("(- x y)", torch.sub),
    "*": ("(* x y)", torch.mul),
    "/": ("(/ x y)", torch.div),
    "maximum": ("(maximum x y)", torch.maximum),
    "minimum": ("(minimum x y)", torch.minimum),
    "where": ("(where (> x y) x y)", lambda x, y: torch.where(x > y, x, y)),
    "matmul": ("(matmul x (transpose y [1 0]))", lambda x, y: x @ y.T),
    "linear": (
        "(linear x y (sum y :axes [1]))",
        lambda x, y: F.linear(x, y, y.sum(1)),
    ),
    "fused-rms-norm": (
        "(fused-rms-norm x (sum y :axes [0]) :eps 1e-3)",
        lambda x, y: F.rms_norm(x, (4,), weight=y.sum(0), eps=1e-3),
    ),
    "fused-layer-norm": (
        "(fused-layer-norm x (sum y :axes [0]) (amax y :axes [0]) :eps 1e-3)",
        lambda x, y: F.layer_norm(x, (4,), y.sum(0), y.amax(0), eps=1e-3),
    ),
    "group-norm": (
        "(group-norm (reshape x [1 4 3]) 2 (sum y :axes [0]) (amax y :axes [0]) :eps 1e-3)",
        lambda x, y: F.group_norm(x.reshape(1, 4, 3), 2, y.sum(0), y.amax(0), eps=1e-3),
    ),
}


def _linear_scan_loop(a, b):
    h, out = torch.zeros_like(b[:, 0]), []
    for t in range(b.shape[1]):
        h = a[:, t] * h + b[:, t]
        out.append(h)
    return torch.stack(out, 1)


def _matrix_scan_loop(a, b):
    h, out = torch.zeros_like(b[:, 0]), []
    for t in range(b.shape[1]):
        h = (a[:, t] @ h.unsqueeze(-1)).squeeze(-1) + b[:, t]
        out.append(h)
    return torch.stack(out, 1)


def source(expression: str, arguments: str, wrt: str) -> str:
    return f"""
(defun forward ({arguments} c)
  (gradient (sum (* {expression} c)) {wrt}))
(defrun r :precision :f32)
"""


def data(positive: bool, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(X_SHAPE, generator=generator)
    return x.abs() + 0.5 if positive else x


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_rule_matches_autograd(name, build):
    expression, reference, positive = UNARY[name]
    x = data(positive, 0)
    module, _ = build(source(expression, "x", "x"))
    with torch.no_grad():
        out_shape = reference(x).shape
    c = torch.randn(out_shape, generator=torch.Generator().manual_seed(1))
    x64 = x.double().requires_grad_()
    (expected,) = torch.autograd.grad((reference(x64) * c.double()).sum(), x64)
    got = module.__dict__[next(iter(module.__all__))]().forward(x, c)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("wrt", ["x", "y"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_rule_matches_autograd(name, wrt, build):
    expression, reference = BINARY[name]
    x, y = data(False, 2), data(False, 3)
    y[0, 0] = x[0, 0]  # a tie, where maximum and minimum split the gradient
    module, _ = build(source(expression, "x y", wrt))
    c = torch.randn(reference(x, y).shape, generator=torch.Generator().manual_seed(4))
    x64, y64 = x.double().requires_grad_(), y.double().requires_grad_()
    expected = torch.autograd.grad(
        (reference(x64, y64) * c.double()).sum(), x64 if wrt == "x" else y64
    )[0]
    got = module.__dict__[module.__all__[0]]().forward(x, y, c)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_broadcast_operands_get_gradients_of_their_own_shape(build):
    module, _ = build(source("(+ x y)", "x y", "y"))
    x, y, c = torch.randn(3, 4), torch.randn(4), torch.randn(3, 4)
    got = module.__dict__[module.__all__[0]]().forward(x, y, c)
    torch.testing.assert_close(got, c.sum(0))


def test_take_gradient_scatters_rows_back(build):
    module, _ = build("""
(defparam table (normal [5 3]))
(defun forward (ids c) (gradient (sum (* (take table ids) c)) table))
""")
    model = module.__dict__[module.__all__[0]]()
    ids = torch.tensor([[0, 2], [2, 4]])
    c = torch.randn(2, 2, 3)
    table = model.table.detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad((table[ids] * c).sum(), table)
    torch.testing.assert_close(model.forward(ids, c), expected)


def test_cross_entropy_gradient(build):
    module, _ = build("""
(defun forward (logits labels) (gradient (cross-entropy logits labels) logits))
""")
    logits, labels = torch.randn(4, 5), torch.tensor([0, 3, 4, 1])
    leaf = logits.clone().requires_grad_()
    (expected,) = torch.autograd.grad(F.cross_entropy(leaf, labels), leaf)
    torch.testing.assert_close(
        module.__dict__[module.__all__[0]]().forward(logits, labels), expected
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_gradient_for_each_reduction(build, reduction):
    module, _ = build(f"""
(defun forward (logits labels c)
  (gradient (sum (* (cross-entropy logits labels :reduction :{reduction}) c)) logits))
""")
    logits, labels = torch.randn(4, 5), torch.tensor([0, 3, 4, 1])
    c = torch.randn(4) if reduction == "none" else torch.tensor(0.7)
    leaf = logits.clone().requires_grad_()
    loss = F.cross_entropy(leaf, labels, reduction=reduction)
    (expected,) = torch.autograd.grad((loss * c).sum(), leaf)
    got = module.__dict__[module.__all__[0]]().forward(logits, labels, c)
    torch.testing.assert_close(got, expected)


def test_every_differentiable_op_is_covered():
    covered = set(UNARY) | set(BINARY) | {"take", "cross-entropy"}
    differentiable = {
        name
        for name, op in REGISTRY.items()
        if op.grad is not None or op.expand is not None
    }
    internal = {
        "ones-like",
        "mean-ones",
        "matmul-ones",
        "zeros-like",
        "sum-to",
        "expand-as",
        "expand-reduced",
        "take-backward",
        "slice-backward",
        "repeat-interleave-backward",
        "group-norm-backward",
        "reshape-as",
        "one-hot",
        "expect-scalar",
    }
    elsewhere = {
        "causal-mask",  # tests/ops/test_attention.py
        "attention-scale",
        "conv1d",  # tests/ops/test_conv_ops.py
        "conv2d",
        "conv-transpose1d",  # tests/ops/test_conv_transpose.py
        "conv-transpose2d",
        "topk",  # tests/ops/test_routing_ops.py
        "cumsum",
        "gather",
        "index-select",
        "index-add",
        "scatter-add",
    }
    # new values: no gradient reaches their input
    constants = {"arange-of", "arange", "linspace"}
    constants |= {"randn-like", "rand-like"}  # their zero: tests/ops/test_noise.py
    without_gradient = {
        "newton-schulz"
    }  # an optimizer step: its iteration has no derivative rule
    missing = (
        differentiable - covered - internal - elsewhere - without_gradient - constants
    )
    assert not missing, f"derivative rules without a test: {sorted(missing)}"
