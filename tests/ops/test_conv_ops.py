"""conv1d, conv2d, pooling and interpolate: one torch call each, compared bit for bit with the
same call written in plain PyTorch, under :f32 and :bf16 and on the cuda and cpu targets
(run here on the CPU), and against the interpreter. On cuda a :bf16 run calls the kernel on
bf16 tensors; the cpu target holds bf16 values in f32, calls it in f32 and rounds once.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sx2torch import interpret
from sx2torch.errors import SourceError

BF16 = torch.bfloat16
RUNS = [("exact", "cuda"), ("exact", "cpu"), ("fast", "cuda"), ("fast", "cpu")]


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def source(args: str, body: str, run: str) -> str:
    """`(defun forward (ARGS) BODY)`; the :bf16 run casts its inputs down first."""
    if run == "fast":
        casts = " ".join(f"({a} (cast {a} :bf16))" for a in args.split())
        body = f"(let ({casts}) {body})"
    return (
        f"(defun forward ({args}) {body})\n"
        "(defrun exact :precision :f32)\n(defrun fast :precision :bf16)\n"
    )


def expected(run: str, target: str, fn, *inputs):
    if run == "exact":
        return fn(*inputs)
    if target == "cuda":
        return fn(*(x.to(BF16) for x in inputs))
    return fn(*(x.to(BF16).float() for x in inputs)).to(BF16).float()


def check(build, run, target, args, body, fn, *inputs):
    text = source(args, body, run)
    module, code = build(text, "m.lisp", run=run, target=target)
    got = module.M()(*inputs)
    want = expected(run, target, fn, *inputs)
    assert got.dtype == want.dtype and got.shape == want.shape, code
    assert torch.equal(got, want), code
    if target == "cuda":  # the interpreter computes as the cuda target does
        oracle = interpret.load(text, "m.lisp", run=run)("forward", *inputs)
        assert torch.equal(oracle, want)
    return code


CONV2D = {
    "plain": ("(conv2d x w)", {}),
    "bias": ("(conv2d x w b :padding 1)", dict(padding=1)),
    "strided": (
        "(conv2d x w b :stride [2 1] :padding [1 0] :dilation 2)",
        dict(stride=(2, 1), padding=(1, 0), dilation=2),
    ),
    "same": ("(conv2d x w b :padding :same)", dict(padding="same")),
}


@pytest.mark.parametrize("kind", sorted(CONV2D))
@pytest.mark.parametrize("run, target", RUNS)
def test_conv2d(build, run, target, kind):
    body, options = CONV2D[kind]
    x, w, b = randn(2, 6, 11, 9, seed=1), randn(8, 6, 3, 3, seed=2), randn(8, seed=3)
    args = "x w b" if " b" in body else "x w"
    inputs = (x, w, b) if " b" in body else (x, w)
    fn = lambda x, w, b=None: F.conv2d(x, w, b, **options)  # noqa: E731
    code = check(build, run, target, args, body, fn, *inputs)
    assert code.count("F.conv2d(") == 1


@pytest.mark.parametrize("run, target", RUNS)
def test_conv1d_grouped(build, run, target):
    x, w, b = randn(3, 8, 20, seed=4), randn(12, 2, 5, seed=5), randn(12, seed=6)
    body = "(conv1d x w b :stride 2 :padding 2 :groups 4)"
    fn = lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=2, groups=4)  # noqa: E731
    code = check(build, run, target, "x w b", body, fn, x, w, b)
    assert "F.conv1d(x, w, b, stride=2, padding=2, groups=4)" in code.replace(
        ".to(torch.bfloat16)", ""
    )


def mamba_conv(x, weight, bias):
    """transformers' MambaMixer.slow_forward: nn.Conv1d(C, C, K, groups=C, padding=K - 1)
    and the first L outputs, `self.conv1d(hidden_states)[..., :seq_len]`."""
    channels, _, k = weight.shape
    conv = torch.nn.Conv1d(channels, channels, k, groups=channels, padding=k - 1)
    with torch.no_grad():
        conv.weight.copy_(weight)
        conv.bias.copy_(bias)
        conv.to(x.dtype)
        return conv(x)[..., : x.shape[-1]]


@pytest.mark.parametrize("run, target", RUNS)
def test_causal_depthwise_conv1d_is_mambas(build, run, target):
    x, w, b = randn(2, 16, 13, seed=7), randn(16, 1, 4, seed=8), randn(16, seed=9)
    body = "(slice (conv1d x w b :padding 3 :groups 16) :axis -1 :end -3)"
    check(build, run, target, "x w b", body, mamba_conv, x, w, b)
    # causal: changing a later step leaves the earlier outputs as they were
    module, _ = build(source("x w b", body, run), "m.lisp", run=run, target=target)
    later = x.clone()
    later[..., 7:] += 1.0
    model = module.M()
    assert torch.equal(model(x, w, b)[..., :7], model(later, w, b)[..., :7])
    assert not torch.equal(model(x, w, b)[..., 7:], model(later, w, b)[..., 7:])


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_bf16_convolution_accumulates_in_f32_and_rounds_once(build, target):
    """Within one bf16 rounding (2^-8 relative) of the exact sum of the bf16 products, plus
    the f32 accumulator's error, which is far below it."""
    x, w = randn(2, 32, 9, 9, seed=10), randn(16, 32, 3, 3, seed=11)
    text = source("x w", "(conv2d x w)", "fast")
    module, _ = build(text, "m.lisp", run="fast", target=target)
    got = module.M()(x, w).double()
    xb, wb = x.to(BF16).double(), w.to(BF16).double()
    exact, magnitude = F.conv2d(xb, wb), F.conv2d(xb.abs(), wb.abs())
    error = (got - exact).abs() - 2.0**-8 * exact.abs()
    assert (error <= 2.0**-20 * magnitude).all()
    assert not torch.equal(got, exact)  # it did round


POOLS = {
    "(max-pool2d x 2)": lambda x: F.max_pool2d(x, 2),
    "(max-pool2d x 3 :stride 2 :padding 1)": lambda x: F.max_pool2d(x, 3, 2, 1),
    "(avg-pool2d x [2 3] :stride 1)": lambda x: F.avg_pool2d(x, (2, 3), 1),
    "(avg-pool2d x 3 :stride 2 :padding 1)": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "(max-pool1d x 3 :stride 2)": lambda x: F.max_pool1d(x.flatten(2), 3, 2),
    "(avg-pool1d x 4)": lambda x: F.avg_pool1d(x.flatten(2), 4),
    "(interpolate x :scale-factor 2.0)": lambda x: F.interpolate(x, scale_factor=2.0),
    "(interpolate x :size [5 7] :mode :bilinear)": lambda x: F.interpolate(
        x, size=(5, 7), mode="bilinear"
    ),
    "(interpolate x :size 12 :mode :bilinear :align-corners true)": lambda x: (
        F.interpolate(x, size=12, mode="bilinear", align_corners=True)
    ),
}


@pytest.mark.parametrize("body", sorted(POOLS))
@pytest.mark.parametrize("run, target", RUNS)
def test_pooling_and_interpolate(build, run, target, body):
    x = randn(2, 3, 8, 10, seed=12)
    if "1d" in body:
        x = x.flatten(2)
    check(build, run, target, "x", body, POOLS[body], x)


def test_max_pooling_is_exact_in_bf16_on_the_held_targets(build):
    module, code = build(
        source("x", "(max-pool2d x 2)", "fast"), run="fast", target="cpu"
    )
    assert "return F.max_pool2d(x, 2)" in code and "store_bf16" not in code


def test_a_const_stride_is_the_constructors(build):
    text = "(defconst patch 4)\n(defun forward (x w) (conv2d x w :stride patch))\n"
    module, code = build(text)
    assert "stride=self.patch" in code
    x, w = randn(1, 3, 16, 16, seed=13), randn(5, 3, 4, 4, seed=14)
    assert torch.equal(module.Model(patch=2)(x, w), F.conv2d(x, w, stride=2))


@pytest.mark.parametrize("extra", ["[2 8 4 4]", "[2 8 5 5]", "[8 1 1]"])
def test_the_output_shape_is_followed_and_a_mismatch_is_located(build, extra):
    """(9 + 2 - 3) // 2 + 1 = 5 with padding 1; 4 without."""
    text = f"""
(defparam img (normal [2 3 9 9]))
(defparam w (normal [8 3 3 3]))
(defparam other (normal {extra}))
(defun forward () (+ (conv2d img w :stride 2) other))
"""
    if extra == "[2 8 5 5]":
        with pytest.raises(SourceError, match=r"\[2 8 4 4\] and \[2 8 5 5\]") as error:
            build(text)
        assert (error.value.line, error.value.column) == (5, 19)  # the (+ ...)
        build(text.replace(":stride 2", ":stride 2 :padding 1"))
    else:
        build(text)


@pytest.mark.parametrize(
    "body, message",
    [
        ("(conv2d x x :padding :full)", r":padding must be an integer, a vector"),
        ("(conv2d x x :stride 1.5)", r":stride must be an integer"),
        ("(interpolate x :mode :cubic)", r":mode must be :nearest or :bilinear"),
        (
            "(gradient (sum (max-pool2d x 2)) x)",
            r"'max-pool2d' has no gradient \(no derivative rule yet",
        ),
    ],
)
def test_misuse_is_one_located_line(build, body, message):
    with pytest.raises(SourceError, match=message) as error:
        build(f"(defun forward (x) {body})")
    assert error.value.line == 1


GRADIENTS = {
    "conv2d": (
        "(conv2d x w b :stride 2 :padding [1 2] :dilation [1 2])",
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=(1, 2), dilation=(1, 2)),
        ((2, 4, 9, 11), (6, 4, 3, 3), (6,)),
    ),
    "conv2d-groups": (
        "(conv2d x w b :padding :valid :groups 2)",
        lambda x, w, b: F.conv2d(x, w, b, groups=2),
        ((2, 4, 7, 7), (6, 2, 3, 3), (6,)),
    ),
    "conv1d-causal": (
        "(slice (conv1d x w b :padding 3 :groups 8) :axis -1 :end -3)",
        lambda x, w, b: F.conv1d(x, w, b, padding=3, groups=8)[..., :-3],
        ((3, 8, 12), (8, 1, 4), (8,)),
    ),
}


@pytest.mark.parametrize("wrt", ["x", "w", "b"])
@pytest.mark.parametrize("kind", sorted(GRADIENTS))
@pytest.mark.parametrize("run", ["exact", "fast"])
def test_convolution_gradients_are_autograds(build, run, kind, wrt):
    """(gradient (sum (* CONV c)) WRT) against torch.autograd.grad of the same sum: dX and dW
    are the kernels autograd runs, bit for bit also in bf16; dBIAS is one sum, in another
    order than autograd's kernel (one rounding in bf16)."""
    body, fn, shapes = GRADIENTS[kind]
    inputs = [randn(*shape, seed=20 + i) for i, shape in enumerate(shapes)]
    text = source("x w b c", f"(gradient (sum (* {body} c)) {wrt})", run)
    reference = [t.to(BF16) if run == "fast" else t for t in inputs]
    reference = [t.clone().requires_grad_() for t in reference]
    y = fn(*reference)
    c = randn(*y.shape, seed=30)
    module, code = build(text, "m.lisp", run=run)
    got = module.M()(*inputs, c)
    c = c.to(y.dtype)
    (want,) = torch.autograd.grad((y * c).sum(), reference["xwb".index(wrt)])
    assert got.dtype == want.dtype and got.shape == want.shape, code
    if wrt == "b":
        bound = 2.0**-7 if run == "fast" else 1e-6
        torch.testing.assert_close(got, want, rtol=bound, atol=bound)
    else:
        assert torch.equal(got, want), code
    assert ("torch.nn.grad." in code) == (wrt != "b")


def test_same_padding_under_gradient_is_one_located_line(build):
    text = "(defun forward (x w) (gradient (sum (conv2d x w :padding :same)) x))"
    with pytest.raises(SourceError, match="with :padding :same has no derivative rule"):
        build(text)
