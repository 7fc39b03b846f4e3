"""Run-time sizes (issue 35): `(size x :axis A)` and Python arithmetic on it serve where torch
takes an int (a slice's bound, a reshape's size, an arange's bounds, a pad's width), written
as plain Python (`x.shape[1] - 1`), rounded nowhere, with no derivative; where only a number
known when the file compiles can serve, a located diagnostic says so."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

SIZES = """
(defparam w (normal [8 8]))
(defun forward (x)
  (let ((t (size x :axis 1))
        (h (matmul x w))
        (heads (reshape h [(size x :axis 0) t 2 -1]))
        (trimmed (slice h :axis 1 :end (- t 1)))
        (padded (pad h [0 0 0 (// t 2)])))
    [heads trimmed padded (arange x 0 (* 2 t) 1)]))
(defun grad (x)
  (gradient (sum (* (slice (matmul x w) :axis 1 :start 1 :end (size x :axis 1))
                    (slice x :axis 1 :end (- (size x :axis 1) 1))))
            w))
(defrun train :precision :bf16)
"""


def _reference(x, w):
    t = x.shape[1]
    h = x.bfloat16() @ w.bfloat16()
    return (
        h.reshape(x.shape[0], t, 2, -1),
        h[:, : t - 1],
        F.pad(h, (0, 0, 0, t // 2)),
        torch.arange(0, 2 * t, 1, dtype=torch.float32),
    )


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_sizes_serve_where_torch_takes_an_int(build, target):
    module, code = build(SIZES, target=target)
    forward = code.split("def forward")[1].split("def grad")[0]
    assert "t = x.shape[1]" in forward
    assert "[:, : t - 1]" in forward and "(0, 0, 0, t // 2)" in forward
    assert ".reshape(x.shape[0], t, 2, -1)" in forward
    model = module.Model()
    torch.manual_seed(0)
    for length in (3, 6):  # one module, the sizes read when it runs
        x = torch.randn(2, length, 8)
        got = model(x)
        for value, want in zip(got, _reference(x, model.w.detach())):
            assert value.shape == want.shape
            assert torch.equal(value.float(), want.float())


def test_a_bound_from_a_size_has_torchs_gradient_and_the_interpreters_values(build):
    source = SIZES.replace(":bf16", ":f32")
    module, _ = build(source)
    model = module.Model()
    interpreted = interpret.load(source, state={"w": model.w.detach()})
    for length in (2, 5):
        x = torch.randn(3, length, 8)
        for got, want in zip(model(x), interpreted.evaluate("forward", [x])):
            assert torch.equal(got, want)
        w = model.w.detach().clone().requires_grad_()
        h = x @ w
        (h[:, 1:length] * x[:, : length - 1]).sum().backward()
        torch.testing.assert_close(model.grad(x), w.grad, rtol=1e-5, atol=1e-5)


def _error(body: str) -> tuple:
    source = f"(defun f (x &key (k 1)) (* x k))\n(defun forward (x)\n  {body})\n"
    with pytest.raises(SourceError) as raised:
        compile_source(source, "model.lisp", Options())
    return raised.value.span.line, raised.value.span.col, raised.value.message


@pytest.mark.parametrize(
    "body, col, message",
    [
        (
            "(slice x :axis (size x :axis 0))",
            18,
            ":axis must be written as numbers: it decides the result's shape, and a "
            "size is known only when the module runs",
        ),
        (
            "(f x :k (- (size x :axis 0) 1))",
            11,
            "expected a number known at compile time, got a number computed from (size "
            "...), "
            "a Python integer known only when the module runs (it may be a slice's "
            "bound, a reshape's size, a pad's width, arange's bounds: where torch takes "
            "an int)",
        ),
        (  # through a let, which names the number: still the size's
            "(let ((m (- (size x :axis 0) 1)) (k (* m 2))) (f x :k k))",
            57,
            "expected a number known at compile time, got a number computed from (size "
            "...), "
            "a Python integer known only when the module runs (it may be a slice's "
            "bound, a reshape's size, a pad's width, arange's bounds: where torch takes "
            "an int)",
        ),
        (
            "(slice x :end (/ (size x :axis 0) 2))",
            17,
            ":end must be an integer, got a number computed from a size that may not be "
            "one: divide sizes with //",
        ),
    ],
)
def test_a_size_where_only_a_compile_time_number_serves_is_located(body, col, message):
    assert _error(body) == (3, col, message)


def test_a_size_in_arithmetic_is_a_python_number_not_a_tensor(build):
    source = "(defun forward (x)\n  (* x (- (size x :axis 0) 1)))\n"
    module, code = build(source)
    assert "return x * (x.shape[0] - 1)" in code
    x = torch.randn(4, 3)
    assert torch.equal(module.Model()(x), x * 3)


def test_len_reads_its_operand_for_its_size_alone(build):
    """`(len x)` reads x's first size alone, as `(size x :axis 0)` does: a parameter's is read
    as it is stored, with no cast made for it, and a product with the length of a value the
    gradient runs through has torch's gradient (the length carries none)."""
    module, code = build(
        "(defparam w (normal [4 4]))\n"
        "(defun forward (x) (+ (matmul x w) (len w)))\n"
        "(defrun train :precision :bf16)\n"
    )
    assert "len(self.w)" in code
    model = module.Model()
    x = torch.randn(3, 4)
    want = x.to(torch.bfloat16) @ model.w.detach().to(torch.bfloat16) + 4
    assert torch.equal(model(x), want)
    module, _ = build(
        "(defparam w (normal [4 4]))\n"
        "(defun forward (x) (matmul x w))\n"
        "(defun grad (x)\n"
        "  (let ((y (matmul x w))) (gradient (sum (* y (len y))) w)))\n"
    )
    model = module.Model()
    w = model.w.detach().clone().requires_grad_()
    y = x @ w
    (y * len(y)).sum().backward()
    torch.testing.assert_close(model.grad(x), w.grad, rtol=1e-6, atol=1e-6)


def test_a_let_of_a_sizes_arithmetic_is_a_local_of_its_name(build):
    """A number computed from a size that a `let` names is a statement of its own, read by
    its name wherever it is a factor or a bound, as a size's is."""
    module, code = build(
        "(defun forward (x)\n"
        "  (let ((n (size x :axis 1)) (m (- n 2)) (h (* x m)))\n"
        "    (+ (slice h :axis 1 :end m) (slice x :axis 1 :start 1 :end (+ m 1)))))\n"
    )
    body = code.split("def forward(self, x):\n")[1]
    assert body.startswith(
        "        n = x.shape[1]\n"
        "        m = n - 2\n"
        "        h = x * m\n"
        "        return h[:, :m] + x[:, 1 : m + 1]\n"
    )
    for length in (3, 7):
        x = torch.randn(2, length)
        m = length - 2
        assert torch.equal(module.Model()(x), (x * m)[:, :m] + x[:, 1 : m + 1])


def test_a_thousand_lets_each_a_step_from_a_size(build):
    """A chain of lets a thousand long, each a step from the one before and the first a
    size: each is one statement, `v2 = v1 + 1`, so no expression nests, and the bound is
    the one the steps compute, at each length the module runs at."""
    steps = " ".join(
        f"(v{i} ({'-' if i % 2 else '+'} v{i - 1} {2 if i % 2 else 1}))"
        for i in range(1, 1001)
    )
    module, code = build(
        "(defun forward (x)\n"
        f"  (let ((v0 (size x :axis 1)) {steps})\n"
        "    (slice x :axis 1 :end v1000)))\n"
    )
    assert "        v1 = v0 - 2\n        v2 = v1 + 1\n" in code
    assert "        v1000 = v999 + 1\n        return x[:, :v1000]\n" in code
    for length in (600, 800):  # each pair of steps takes one away
        x = torch.randn(2, length)
        assert torch.equal(module.Model()(x), x[:, : length - 500])
