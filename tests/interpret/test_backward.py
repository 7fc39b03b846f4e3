"""The interpreter's gradient (sx2torch/interpret/backward.py) follows docs/LANGUAGE.md's
rules, checked against the rules' arithmetic written in plain PyTorch: each backward node is
typed as the forward is (contagion from the values it reads, its forward node's marks), a
gradient has its last backward node's dtype, a value's contributions are summed in the marks
its readers share, and a with-numerics form directly around a gradient marks the backward
only."""

import torch

from sx2torch import interpret

BF = torch.bfloat16
X = torch.tensor([[0.5, -1.25, 1 + 2**-9, 0.75], [-0.5, 1.5, 0.25, -1 - 2**-8]])
W = torch.tensor(
    [[1 + 2**-8, 0.5, -0.25, 1.0], [0.5, -1.0, 0.75, 2**-7], [0.25, 1.5, -0.5, 1.0]] * 2
)[:4]
V = torch.tensor([0.5, -0.75, 1 + 2**-7, 0.25])


def _model(source: str):
    return interpret.load(source, state={"w": W, "v": V})


def test_a_gradient_through_a_parameter_is_bf16_and_one_without_keeps_x_s_f32():
    """golden gradient-dtype: d/dx sum(x w) is ones @ w^T, a bf16 node (it reads w); d/dx
    sum(x x) reads no parameter: f32, the two contributions summed."""
    model = _model(
        "(defparam w (normal [4 4]))\n(defparam v (normal [4]))\n"
        "(defun forward (x) (gradient (sum (matmul x w)) x))\n"
        "(defun plain (x) (gradient (sum (* x x)) x))\n(defrun train :precision :bf16)\n"
    )
    got = model("forward", X)
    want = torch.ones(2, 4, dtype=BF) @ W.to(BF).T
    assert got.dtype == BF and torch.equal(got, want)
    plain = model("plain", X)
    assert plain.dtype == torch.float32 and torch.equal(plain, X + X)


def test_a_parameter_s_gradient_has_the_dtype_of_the_node_that_computes_it():
    """corpus rule-gradient-dtype-backward-f32: the gradient of a frozen v that a bf16
    matmul reads is x^T @ g, which reads no parameter and no bf16 value: f32, where X's
    reads (bf16) would give bf16."""
    model = _model(
        "(defparam v (normal [4]) :trainable false)\n"
        "(defun forward (x) (gradient (mean (matmul x v)) v))\n"
        "(defrun train :precision :bf16)\n"
    )
    got = model("forward", X)
    assert got.dtype == torch.float32
    assert torch.equal(got, X.T @ torch.full((2,), 0.5))


def test_the_backward_of_a_function_rounds_at_each_op_and_meets_bf16_late():
    """corpus rule-gradient-dtype-backward-bf16: x is read by f32 ops only, before a bf16
    matmul; the backward turns bf16 at w and stays so down to x, the quotient's rule
    written out: g / b by the numerator, -(g * y / b) by the denominator."""
    model = _model(
        "(defparam w (normal [4 4]))\n"
        "(defun forward (x) (gradient (sum (matmul (/ x (+ x 2.0)) w)) x))\n"
        "(defrun train :precision :bf16)\n"
    )
    got = model("forward", X)
    b = X + 2.0
    y = (X / b).to(BF)
    g = torch.ones(2, 4, dtype=BF) @ W.to(BF).T
    want = g / b.to(BF) + -(g * y / b.to(BF))
    assert got.dtype == BF and torch.equal(got, want)


def test_contributions_sum_in_the_marks_their_readers_share():
    """golden gradient-region-reads: under :f32, x read inside a bf16 region (tanh) and
    outside it (+): each contribution in its reader's marks, the sum outside, in f32."""
    model = _model(
        "(defun forward (x) (gradient (sum (+ (with-numerics (:precision :bf16) "
        "(tanh x)) x)) x))\n"
        "(defun twice (x) (gradient (sum (with-numerics (:precision :bf16) "
        "(* x (tanh x)))) x))\n"
    )
    ones = torch.ones(2, 4)
    t = torch.tanh(X.to(BF))
    got = model("forward", X)
    want = ones + (ones.to(BF) * (1.0 - torch.square(t))).float()
    assert got.dtype == torch.float32 and torch.equal(got, want)
    twice = model("twice", X)
    by_tanh = ones.to(BF) * X.to(BF)
    want = ones.to(BF) * t + by_tanh * (1.0 - torch.square(t))
    assert twice.dtype == BF and torch.equal(twice, want)


def test_a_form_directly_around_a_gradient_marks_its_backward_only():
    """corpus rule-region-around-gradient, and the seed's page: the forward computes as
    the policy says (bf16 under :bf16), the whole backward as the form says (f32)."""
    model = _model(
        "(defparam w (normal [4 4]))\n"
        "(defun forward (x) (with-numerics (:sensitivity :high) "
        "(gradient (sum (* (matmul x w) x)) x)))\n(defrun train :precision :bf16)\n"
    )
    product = X.to(BF) @ W.to(BF)
    ones = torch.ones(2, 4)
    want = ones * product.float() + (ones * X) @ W.T
    got = model("forward", X)
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_a_high_parameter_s_backward_reads_its_master_in_f32():
    """golden gradient-high: (matmul x w) of a :numerics :high w is an f32 node, and so is
    its backward, though the gradient reaching it is bf16."""
    model = interpret.load(
        "(defparam w (normal [4 4]) :numerics :high)\n(defparam v (normal [4 4]))\n"
        "(defun forward (x) (gradient (mean (matmul (matmul x w) v)) x))\n"
        "(defrun train :precision :bf16)\n",
        state={"w": W, "v": W.T.contiguous()},
    )
    g = torch.full((2, 4), 1 / 8).to(BF) @ W.T.contiguous().to(BF).T
    want = g.float() @ W.T
    got = model("forward", X)
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_a_gradient_of_a_gradient_differentiates_the_first_backward():
    """d/dx sum(d/dx sum(x^3)) = d/dx sum(3x^2) = 6x, through the first backward's nodes."""
    model = _model(
        "(defun forward (x) (gradient (sum (gradient (sum (* (* x x) x)) x)) x))\n"
    )
    assert torch.allclose(model("forward", X), 6 * X, rtol=0, atol=1e-6)


def _if_model(taken: str, other: str, y: str = "(sum {if})"):
    """(gradient Y x) under :bf16, with `(if (= d 4) TAKEN OTHER)` as Y's {if}."""
    form = y.format(**{"if": f"(if (= d 4) {taken} {other})"})
    return _model(
        "(defconst d 4)\n(defparam w (normal [4 4]))\n(defparam v (normal [4]))\n"
        f"(defun forward (x) (gradient {form} x))\n(defrun train :precision :bf16)\n"
    )


def test_a_backward_if_is_joined_with_the_branch_not_taken():
    """corpus found-if-backward-join: the x branch passes the gradient on in f32, the
    matmul branch's would be bf16; the backward `if` joins the two, as the forward `if`:
    bf16. Its contributions are summed within the branch, then cast to the join."""
    got = _if_model("x", "(matmul x v)")("forward", X)
    assert got.dtype == BF and torch.equal(got, torch.ones(2, 4, dtype=BF))
    got = _if_model("(* x (sin x))", "(matmul x w)")("forward", X)
    want = (torch.sin(X) + X * torch.cos(X)).to(BF)
    assert got.dtype == BF and torch.equal(got, want)


def test_a_backward_if_joins_where_the_forward_branches_agree():
    """Both branches are f32 forward ((cast ... :f32)); the backward of the second reads
    w in bf16, so the backward `if` is bf16 all the same."""
    got = _if_model("(square x)", "(cast (matmul x w) :f32)")("forward", X)
    assert got.dtype == BF and torch.equal(got, (2.0 * X).to(BF))


def test_a_value_only_the_branch_not_taken_reads_gets_zeros_in_that_branch_s_dtype():
    """x's contribution is zeros where the taken branch reads it not, in the dtype of the
    other branch's (bf16, through w); a branch that reads x in f32 only leaves it f32."""
    got = _if_model("(* w 2.0)", "(matmul x w)")("forward", X)
    assert got.dtype == BF and torch.equal(got, torch.zeros(2, 4, dtype=BF))
    plain = _if_model("(square x)", "(* w 2.0)", y="(sum (+ x {if}))")("forward", X)
    assert plain.dtype == torch.float32 and torch.equal(plain, 1.0 + 2.0 * X)


def test_tanh_gelu_s_backward_rounds_at_each_op_of_its_formula():
    """golden-style (gelu :approximate :tanh) under :bf16: with u = c (x + k x^3), the
    derivative 1/2 (1 + tanh u) + 1/2 x (1 - tanh^2 u) c (1 + 3k x^2), each op a bf16 node
    (torch's own derivative would round once)."""
    model = _model(
        "(defparam w (normal [4 4]))\n"
        "(defun forward (x) (gradient (sum (gelu (matmul x w) :approximate :tanh)) x))\n"
        "(defrun train :precision :bf16)\n"
    )
    m = X.to(BF) @ W.to(BF)
    c, k = 0.7978845608028654, 0.044715
    square = m * m
    tanh = torch.tanh((m + square * m * k) * c)
    rise = m * 0.5 * (1.0 - tanh * tanh) * ((1.0 + square * (3 * k)) * c)
    g = torch.ones(2, 4, dtype=BF) * (0.5 * (1.0 + tanh) + rise)
    got = model("forward", X)
    assert got.dtype == BF and torch.equal(got, g @ W.to(BF).T)


def test_a_derivative_that_is_the_gradient_itself_carries_no_marks():
    """corpus rule-pass-through-backward: (- x 0.5) in an f32 island passes the bf16
    gradient of the matmul on as it is; (* x 2.0) there computes its backward in f32.
    Under :f32, x + 1.0 outside a region passes the region's bf16 gradient on."""
    island = "(with-numerics (:sensitivity :high) {})"
    source = (
        "(defparam w (normal [4 4]))\n"
        f"(defun forward (x) (gradient (sum (matmul {island.format('(- x 0.5)')} w)) x))\n"
        f"(defun twice (x) (gradient (sum (matmul {island.format('(* x 2.0)')} w)) x))\n"
        "(defrun train :precision :bf16)\n"
    )
    model = _model(source)
    g = torch.ones(2, 4, dtype=BF) @ W.to(BF).T
    got = model("forward", X)
    assert got.dtype == BF and torch.equal(got, g)
    twice = model("twice", X)
    assert twice.dtype == torch.float32 and torch.equal(twice, g.float() * 2.0)
    plain = _model(
        "(defun forward (x) (gradient (sum (let ((h (+ x 1.0))) "
        "(with-numerics (:precision :bf16) (tanh h)))) x))\n"
    )("forward", X)
    t = torch.tanh((X + 1.0).to(BF))
    want = torch.ones(2, 4, dtype=BF) * (1.0 - torch.square(t))
    assert plain.dtype == BF and torch.equal(plain, want)


def test_a_full_sum_s_ones_are_made_where_its_input_is_computed():
    """(sum (region (+ x 1.0))) under :f32: the ones are bf16, made in the region, and the
    sum passes them on; a full mean's backward divides outside the region: f32."""
    region = "(with-numerics (:precision :bf16) (+ x 1.0))"
    model = _model(
        f"(defun forward (x) (gradient (sum {region}) x))\n"
        f"(defun averaged (x) (gradient (mean {region}) x))\n"
    )
    got = model("forward", X)
    assert got.dtype == BF and torch.equal(got, torch.ones(2, 4, dtype=BF))
    averaged = model("averaged", X)
    assert averaged.dtype == torch.float32
    assert torch.equal(averaged, torch.full((2, 4), 1 / 8))


def test_contributions_from_an_island_in_a_region_sum_in_the_region():
    """corpus found-gradient-island-in-region: x read by (exp x) in an f32 island inside a
    bf16 region and by the region's + : the marks the two readers share are the region's,
    so the sum is bf16 (it was summed outside any form, in f32 under :f32)."""
    model = _model(
        "(defun forward (x) (gradient (sum (with-numerics (:precision :bf16) "
        "(+ (with-numerics (:sensitivity :high) (exp x)) x))) x))\n"
    )
    g = torch.ones(2, 4, dtype=BF)
    want = g + (g.float() * torch.exp(X)).to(BF)
    got = model("forward", X)
    assert got.dtype == BF and torch.equal(got, want)
