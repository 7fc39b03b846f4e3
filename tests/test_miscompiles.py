"""Silent miscompiles found by an adversarial corpus, each run against plain PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError
from sx2torch.ops import REGISTRY


def test_chain_extra_argument_keeps_the_callers_value(build):
    """`(chain ls layer layer)`: every block gets the carried value and the caller's `layer`."""
    source = """
(defmodel blk ()
  (defparam w (normal [4 4]))
  (defun forward (x y) (+ (matmul x w) y)))
(defparam ls (stack 3 (blk)))
(defun forward (layer) (chain ls layer layer))
"""
    module, _ = build(source)
    model = module.Model()
    layer = torch.randn(2, 4)
    expected = layer
    for block in model.ls:
        expected = expected @ block.w + layer
    assert torch.equal(model(layer), expected)


def test_a_specialization_never_takes_a_source_defuns_name(build):
    source = """
(defparam w (normal [4 4]))
(defun f (x) (matmul x w))
(defun f-bf16 (x) (* x 2.0))
(defun g (x) (f (cast x :bf16)))
(defun forward (x) (+ (f x) (f-bf16 x)))
(defrun train :precision :bf16)
"""
    module, code = build(source)
    model = module.Model()
    x = torch.randn(3, 4)
    assert torch.equal(model.f_bf16(x), x * 2.0)
    assert "def f_bf16(self, x):\n        return x * 2.0" in code


def test_a_const_named_like_a_class_does_not_shadow_it(build):
    source = """
(defconst Block 3)
(defmodel block ()
  (defparam w (normal [4 4]))
  (defun forward (x) (matmul x w)))
(defparam b (block))
(defun forward (x) (* (b x) Block))
"""
    module, _ = build(source)
    model = module.Model(Block_=5)
    x = torch.randn(2, 4)
    assert torch.equal(model(x), (x @ model.b.w) * 5)


def test_slice_with_key_bounds_uses_the_callers_values(build):
    """The default of `i` is 0; `pick :i 2` must take element 2, not elements 0..2."""
    source = """
(defparam v (normal [8]))
(defun pick (&key (i 0)) (slice v :start i :end (+ i 1)))
(defun forward (x) (* x (pick :i 2)))
"""
    module, _ = build(source)
    model = module.Model()
    assert torch.equal(model.pick(i=2), model.v[2:3])
    assert torch.equal(model.pick(i=0), model.v[0:1])
    x = torch.randn(3, 1)
    assert torch.equal(model(x), x * model.v[2:3])


def test_reshape_with_a_key_size_is_not_the_keep_marker(build):
    """`0` in a reshape keeps the input's size, but a key whose default is 0 is a size."""
    source = """
(defun f (x &key (n 0)) (reshape x [n -1]))
(defun forward (x) (f x :n 2))
"""
    module, _ = build(source)
    x = torch.arange(12.0).reshape(3, 4)
    assert module.Model()(x).shape == (2, 6)
    assert module.Model().f(x, n=4).shape == (4, 3)


def test_reshape_with_a_const_size_follows_the_constructor(build):
    source = """
(defconst n 0)
(defun forward (x) (reshape x [n -1]))
"""
    module, _ = build(source)
    x = torch.arange(12.0).reshape(3, 4)
    assert module.Model(n=6)(x).shape == (6, 2)


@pytest.mark.parametrize(
    "body, at",
    [
        ("(sum x :axes [0] :keepdims k)", "k)"),
        ("(sum x :axes [k])", "[k]"),
        ("(transpose x [k 0])", "[k 0]"),
        ("(slice x :axis k :end 1)", "k :end"),
        ("(logsumexp x :axes [0] :keepdims k)", "k)"),
    ],
)
def test_an_argument_that_decides_the_shape_must_be_a_literal(body, at):
    default = "false" if "keepdims" in body else "0"
    line = f"(defun f (x &key (k {default})) {body})"
    with pytest.raises(SourceError) as error:
        compile_source(line + "\n(defun forward (x) (f x))\n", "model.lisp")
    assert error.value.span.line == 1
    assert error.value.span.col == line.rindex(at) + 1
    assert "must be written as" in str(error.value)


def test_the_key_defaults_golden_case_runs_with_the_callers_values():
    from pathlib import Path

    from conftest import load_module

    source = Path(__file__).parent.parent / "golden" / "key-defaults.lisp"
    module = load_module(compile_source(source.read_text(), source.name))
    model = module.KeyDefaults()
    x = torch.randn(4, 3)
    expected = x.reshape(2, -1) * torch.sum(model.table[2:4])
    assert torch.equal(model(x), expected)


@pytest.mark.parametrize(
    "name", sorted(name for name, op in REGISTRY.items() if op.internal)
)
def test_an_internal_op_is_unknown_to_source(name):
    """`(newton-schulz-bf16 ...)` from source would skip the bf16 region its caller opens."""
    source = f"(defparam w (normal [4 4]))\n(defun forward (x) ({name} x w))\n"
    with pytest.raises(SourceError) as error:
        compile_source(source, "model.lisp")
    assert str(error.value).startswith(f"unknown op or function '{name}'")
    assert (error.value.span.line, error.value.span.col) == (2, 21)


def test_the_internal_ops_are_the_compilers_own():
    internal = {name for name, op in REGISTRY.items() if op.internal}
    assert {"newton-schulz-bf16", "sum-to", "cross-entropy-backward"} <= internal
    assert not {"newton-schulz", "matmul", "softmax", "outer"} & internal


def test_a_cast_written_in_one_branch_is_not_read_in_the_other(build):
    """The shared `y.to(bf16)` of the then-branch once served the else-branch too, where
    it was never assigned: a NameError whenever the module took the else-branch."""
    source = """
(defparam w (normal [4 4]))
(defun forward (x &key (c true))
  (let ((y (with-numerics (:sensitivity :high) (exp x))))
    (if c (let ((a (matmul y w))) (* a (matmul y w))) (let ((b (matmul y w))) b))))
(defrun train :precision :bf16)
"""
    module, _ = build(source, target="cpu")
    model = module.Model()
    x = torch.randn(3, 4)
    w = model.w.detach().bfloat16()
    y = torch.exp(x).bfloat16()
    assert torch.equal(model(x, c=False), (y @ w).float())
    assert torch.equal(model(x), ((y @ w) * (y @ w)).float())


ZERO_D = """
(defparam w (normal [4 4]))
(defparam v (normal [4]))
(defparam vh (normal [4]) :numerics :high)
(defun forward (x) (+ x (at w 0)))
(defun mixed (x) (matmul (- (* x v) (at (* x x) 0)) w))
(defun cast-element (x) (* (cast (at v 3) :bf16) x))
(defun cast-high-element (x) (* (cast (at vh 3) :bf16) x))
(defun gate-first (x) (* (sigmoid (at vh 2)) (linear x w)))
(defun gate-second (x) (* (linear x w) (sigmoid (at vh 2))))
(defrun train :precision :bf16)
"""


def _zero_d_model(build, target):
    module, _ = build(ZERO_D, target=target)
    model = module.Model()
    with torch.no_grad():
        model.w.fill_(0.75)
        model.v.copy_(torch.tensor([0.3, -1.1, 2.2, 1 + 2**-8]))
        model.vh.copy_(torch.tensor([0.1, 0.2, 0.3, 1 + 2**-8]))
    return model


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_a_row_of_a_matrix_is_a_tensor_with_axes(build, target):
    """`(at w 0)` of a [4 4] matrix is a row, rank 1: contagion applies (bf16), where it
    was taken as a 0-d element and the sum stayed f32."""
    model = _zero_d_model(build, target)
    x = torch.randn(3, 4)
    w = model.w.detach().bfloat16()
    result = model(x)
    assert result.dtype == (torch.bfloat16 if target == "cuda" else torch.float32)
    assert torch.equal(result.float(), (x.bfloat16() + w[0]).float())


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_a_row_of_an_argument_is_cast_for_the_matmul(build, target):
    """The row (at (* x x) 0) beside a bf16 product: cast down, so the matmul's operands
    agree (a RuntimeError about m1 and m2's dtypes before)."""
    model = _zero_d_model(build, target)
    x = torch.randn(3, 4)
    v, w = model.v.detach().bfloat16(), model.w.detach().bfloat16()
    expected = (x.bfloat16() * v - (x * x)[0].bfloat16()) @ w
    assert torch.equal(model.mixed(x).float(), expected.float())


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_a_cast_of_an_element_to_its_own_dtype_keeps_it_0_d(build, target):
    """`(cast (at v 3) :bf16)` is the identity on the bf16 element: still 0-d, it decides
    no dtype, so the product with an f32 x is f32 (it was bf16)."""
    model = _zero_d_model(build, target)
    x = torch.full((2, 4), 1 + 2**-8)
    for method, vector in (
        (model.cast_element, model.v),
        (model.cast_high_element, model.vh),
    ):
        result = method(x)
        assert result.dtype == torch.float32
        element = vector.detach()[3].bfloat16().float()  # 1.0
        assert torch.equal(result, element * x)
        assert not torch.equal(result, (element * x).bfloat16().float())


def _gated(model, x, first: bool):
    """The rule: the bf16 product reads the f32 0-d gate in bf16, as a GPU's kernel does."""
    gate = torch.sigmoid(model.vh.detach()[2]).bfloat16()
    linear = torch.nn.functional.linear(x.bfloat16(), model.w.detach().bfloat16())
    return (gate * linear if first else linear * gate).float()


@pytest.mark.parametrize("target", ["cpu", "metal", "cuda"])
def test_an_f32_0_d_operand_of_a_bf16_op_is_read_in_bf16(build, target):
    """sigmoid(0.3) * 3: 1.71875 when the gate is rounded first, 1.7265625 when only the
    product is; the held targets rounded only the product. The cuda module leaves the
    rounding to torch, whose CPU kernel rounds a first 0-d operand, not a second."""
    model = _zero_d_model(build, target)
    x = torch.ones(2, 4)
    expected = _gated(model, x, first=True)
    assert expected[0, 0].item() == 1.71875
    assert torch.equal(model.gate_first(x).float(), expected)
    if target != "cuda":
        assert torch.equal(model.gate_second(x).float(), _gated(model, x, first=False))


@pytest.mark.parametrize(
    "source, read",
    [
        (
            """
(defparam w (normal [4 4]) :trainable false)
(defun f (x) (matmul x w))
(defun forward (x) (with-numerics (:precision :bf16) (f x)))
""",
            lambda model: (model.w, model.f),
        ),
        (
            """
(defmodel sub ()
  (defparam w (normal [4 4]) :trainable false)
  (defun forward (x) (matmul x w)))
(defparam s (sub))
(defun forward (x) (with-numerics (:precision :bf16) (s x)))
""",
            lambda model: (model.s.w, model.s.forward),
        ),
    ],
    ids=["defun", "sub-model"],
)
def test_a_frozen_parameter_a_public_method_reads_in_f32_stays_f32(build, source, read):
    """Only the region's specialization was counted as a reader, so `w` was stored bf16:
    the public method read it as `self.w.float()`, 1.0 for a loaded 1 + 2^-8."""
    module, _ = build(source)
    model = module.Model()
    model.load_state_dict(
        {k: torch.full((4, 4), 1 + 2**-8) for k in model.state_dict()}
    )
    weight, method = read(model)
    assert weight.dtype == torch.float32
    assert torch.equal(method(torch.ones(1, 4)), torch.full((1, 4), 4.015625))


IF_OF_PARAMS = """
(defconst d 4)
(defparam w (normal [4 4]))
(defparam s (normal [4 4]) :dtype :bf16)
(defparam hi (normal [4 4]) :numerics :high)
(defparam f (normal [4 4]) :trainable false)
(defun forward (x) (linear x (if (= d 4) w w)))
(defun stored (x) (linear x (if (= d 4) s w)))
(defun high (x) (linear x (if (= d 4) w hi)))
(defun frozen (x) (linear x (if (= d 4) f f)))
(defun value (x) (if (= d 4) w s))
(defrun train :precision :bf16)
"""


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_an_if_of_parameter_reads_is_a_parameter_read(build, target):
    """`(linear x (if c w w))` under :bf16 computes in bf16, each branch reading w as the
    linear does (it read f32 masters: an f32 linear); f32 where a branch is :numerics
    :high; a frozen one is stored bf16; returned, the if has its branches' join."""
    module, _ = build(IF_OF_PARAMS, target=target)
    model = module.Model()
    odd = torch.full((4, 4), 1 + 2**-8)  # not a bf16 value: a cast down shows
    model.load_state_dict({k: odd for k in model.state_dict()})
    x = torch.full((2, 4), 1 + 2**-7)
    held = torch.float32 if target != "cuda" else torch.bfloat16
    bf16 = F.linear(x.bfloat16(), odd.bfloat16())
    for method, expected in (
        (model.forward, bf16),
        (model.stored, bf16),
        (model.frozen, bf16),
        (model.high, F.linear(x, odd)),
    ):
        got = method(x)
        assert got.dtype == (
            held if expected.dtype == torch.bfloat16 else expected.dtype
        )
        assert torch.equal(got.float(), expected.float())
    assert model.f.dtype == torch.bfloat16
    value = model.value(x)
    assert value.dtype == held and torch.equal(value.float(), odd.bfloat16().float())
