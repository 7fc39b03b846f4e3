"""`gradient` through an `if` (a backward `if` on the same condition), and inside a loop's body."""

from __future__ import annotations

import pytest
import torch

IF_SOURCE = """
(defconst gated true)
(defparam w (normal [4 4]))
(defparam gate (normal [4]))
(defun forward (x)
  (gradient (sum (let ((h (matmul x w)))
                   (if gated (* (relu h) gate) (exp (* h 0.5)))))
            x))
"""


@pytest.mark.parametrize("gated", [True, False])
def test_gradient_through_if_follows_the_branch_the_module_takes(build, gated):
    module, code = build(IF_SOURCE)
    assert code.count("if self.gated:") == 2  # the forward's and the backward's
    model = module.Model(gated=gated)
    x = torch.randn(3, 4)
    reference = x.clone().requires_grad_()
    w, gate = model.w.detach(), model.gate.detach()
    h = reference @ w
    y = torch.relu(h) * gate if gated else torch.exp(h * 0.5)
    y.sum().backward()
    torch.testing.assert_close(model(x), reference.grad)


def test_a_branch_that_does_not_read_a_value_gives_it_zeros(build):
    source = """
(defun forward (a &key (pick-a true))
  (let ((b (* a 3.0)))
    (gradient (sum (if pick-a (* a a) (exp b))) a)))
"""
    module, _ = build(source)
    model = module.Model()
    a = torch.randn(5)
    torch.testing.assert_close(model(a), 2 * a)
    torch.testing.assert_close(model(a, pick_a=False), 3 * torch.exp(3 * a))


def test_gradient_inside_a_loop_body_differentiates_the_carried_value(build):
    """It once gave zeros: the backward looked for Y among the method's own nodes only."""
    source = """
(defmodel block ()
  (defparam w (normal [4 4] :std 0.5))
  (defun forward (x) (matmul x w)))
(defparam blocks (stack 3 (block)))
(defun forward (x0)
  (for (i layer blocks) ((x x0))
    (layer (gradient (sum (* x (sin x))) x))))
"""
    module, _ = build(source)
    model = module.Model()
    x = torch.randn(2, 4)
    expected = x
    for block in model.blocks:
        expected = (torch.sin(expected) + expected * torch.cos(expected)) @ block.w
    torch.testing.assert_close(model(x), expected.detach())


LOOP_SOURCE = """
(defconst backout-layer 1)
(defmodel block (&key (d 4))
  (defparam w (normal [d d] :std 0.5))
  (defun forward (x &key (scale 1.0))
    (+ x (* scale (tanh (matmul x w))))))
(defparam blocks (stack 3 (block :d 4)))
(defparam gate (normal [4]))
(defun energy (x0)
  (let ((g (sin x0))
        ([x backout]
         (for (i layer blocks) ((x x0) (backout x0))
           (let ((y (layer (* x g) :scale (if (< i 2) 1.0 0.5)))
                 (y (if (= i 1) (* y gate) y)))
             [y (if (= i backout-layer) y backout)]))))
    (sum (* (- x backout) x))))
(defun forward (x0) (gradient (energy x0) x0))
(defun dgate (x0) (gradient (energy x0) gate))
(defun chained (x) (gradient (sum (chain blocks x)) x))
"""


def reference_energy(model, x0, backout_layer):
    g = torch.sin(x0)
    x, backout = x0, x0
    for i, block in enumerate(model.blocks):
        y = x * g + (1.0 if i < 2 else 0.5) * torch.tanh((x * g) @ block.w)
        y = y * model.gate if i == 1 else y
        x, backout = y, (y if i == backout_layer else backout)
    return torch.sum((x - backout) * x)


@pytest.mark.parametrize("backout_layer", [1, 2])
def test_gradient_through_a_loop_is_an_adjoint_loop_that_matches_autograd(
    build, backout_layer
):
    module, code = build(LOOP_SOURCE)
    assert "for i, layer in reversed(list(enumerate(self.blocks))):" in code
    model = module.Model(backout_layer=backout_layer)
    x0 = torch.randn(2, 4)
    reference = x0.clone().requires_grad_()
    energy = reference_energy(model, reference, backout_layer)
    dx, dgate = torch.autograd.grad(energy, [reference, model.gate])
    torch.testing.assert_close(model(x0), dx)
    torch.testing.assert_close(model.dgate(x0), dgate)


def test_gradient_through_chain(build):
    module, _ = build(LOOP_SOURCE)
    model = module.Model()
    x = torch.randn(2, 4)
    reference = x.clone().requires_grad_()
    h = reference
    for block in model.blocks:
        h = h + torch.tanh(h @ block.w)
    (dx,) = torch.autograd.grad(h.sum(), [reference])
    torch.testing.assert_close(model.chained(x), dx)


def test_the_adjoint_loop_runs_in_the_policys_dtypes(build):
    """Under :bf16 the recomputed forward and its backward are bf16, as the forward is;
    the layer's weight is cast inside the loop, where the layer is known."""
    module, code = build(LOOP_SOURCE + "(defrun train :precision :bf16)")
    # the forward loop and the adjoint loop of each of the three gradients
    assert code.count("w_bf16 = layer.w.to(torch.bfloat16)") == 6
    torch.manual_seed(
        0
    )  # the bound is for this draw, whatever tests ran before in the worker
    model = module.Model()
    x0 = torch.randn(2, 4)
    reference = x0.clone().requires_grad_()
    (dx,) = torch.autograd.grad(reference_energy(model, reference, 1), [reference])
    got = model(x0)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - dx).norm() / dx.norm()).item() < 2**-5


READS = """
(defun forward (x) (gradient (sum (with-numerics (:precision :bf16) (concat [x (tanh x)] :axis 1))) x))
(defun twice (x) (gradient (sum (with-numerics (:precision :bf16) (* x (tanh x)))) x))
(defun once (x) (gradient (sum (with-numerics (:precision :bf16) (tanh x))) x))
"""


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_the_gradient_of_x_read_in_a_region_is_bf16_however_often_it_is_read(
    build, target
):
    """known-4: the sum of X's contributions is computed where its readers all are, in the
    region, so X read twice gets a bf16 gradient as X read once does (it was an f32 sum of
    two bf16 contributions, outside the region); against torch.autograd on bf16 tensors.
    """
    module, _ = build(READS, target=target)
    model = module.Model()
    x = torch.randn(2, 4)
    functions = {
        "forward": lambda b: torch.cat([b, torch.tanh(b)], dim=1),
        "twice": lambda b: b * torch.tanh(b),
        "once": torch.tanh,
    }
    for name, f in functions.items():
        b = x.to(torch.bfloat16).requires_grad_()
        (want,) = torch.autograd.grad(f(b).sum(), b)
        got = getattr(model, name)(x)
        held = target == "cpu"
        assert got.dtype == (torch.float32 if held else torch.bfloat16), name
        if held:
            assert torch.equal(got, got.to(torch.bfloat16).float()), name
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7)


def test_the_gradient_of_a_sum_of_x_itself_is_the_seed(build):
    """No node reads X on the way: the seed is its gradient (a KeyError once)."""
    module, _ = build("(defun forward (x) (gradient (sum x) x))")
    assert torch.equal(module.Model()(torch.randn(2, 4)), torch.ones(2, 4))


def test_x_read_in_two_bf16_regions_gets_a_bf16_gradient_summed_in_one(build):
    """The readers share their marks (bf16), though they are two regions: the sum of their
    contributions is in a region too, as for X read twice in one (difftest seed 1052988).
    """
    source = """
(defparam w (normal [4 4]))
(defun forward (x)
  (gradient (mean (concat [(with-numerics (:precision :bf16) (matmul x w))
                           (with-numerics (:precision :bf16) (matmul x w))] :axis 1))
            x))
"""
    module, code = build(source)
    model = module.Model()
    x = torch.randn(2, 4)
    bf = torch.bfloat16
    w = model.w.detach().to(bf)
    g = torch.full((2, 4), 1 / 16).to(bf)  # the mean's gradient, each half
    part = g @ w.T
    got = model(x)
    assert got.dtype == bf
    assert torch.equal(got, part + part)


def test_zeros_where_a_branch_reads_a_value_not_decide_no_dtype(build):
    """corpus found-backward-if-zeros: under :f32, the branch taken gives x's contribution
    in bf16 (a reshape in a bf16 region), the other reads x not: its zeros are made bf16,
    in the region, and the backward `if` is bf16; they were f32 zeros that made the join
    f32."""
    module, code = build(
        "(defmodel blk (&key (idx 0))\n"
        "  (defun forward (x) (if (= idx 1) 8 (reshape x [8]))))\n"
        "(defparam sub (blk))\n"
        "(defun forward (x) (gradient (mean (with-numerics (:precision :bf16) (sub x))) x))\n"
    )
    assert "torch.zeros_like(x, dtype=torch.bfloat16)" in code
    got = module.Model()(torch.randn(2, 4))
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, torch.full((2, 4), 1 / 8, dtype=torch.bfloat16))


def test_a_branch_sums_a_value_s_contributions_in_the_marks_its_readers_share(build):
    """corpus found-backward-if-branch-sum: x read twice by (* x x) in a bf16 region, in
    the branch taken: the two contributions are summed in the region, in bf16, as a value
    read twice outside an `if` is (they were summed in x's own marks, in f32)."""
    module, code = build(
        "(defmodel blk (&key (idx 0))\n"
        "  (defun forward (x) (if (= idx 1) 8 (* x x))))\n"
        "(defparam sub (blk))\n"
        "(defun forward (x) (gradient (mean (with-numerics (:precision :bf16) (sub x))) x))\n"
    )
    # the zeros are made where the `if` is, in its branch (an `if` statement, the
    # conditional being too long for its line): no zeros_like_x copy
    zeros = "    grad_x = torch.zeros_like(x, dtype=torch.bfloat16)\n"
    assert zeros in code and "zeros_like_x" not in code
    x = torch.tensor([[0.5, -1.25, 1 + 2**-7, 0.75], [-0.5, 1.5, 0.25, -1 - 2**-6]])
    got = module.Model()(x)
    g = torch.full((2, 4), 1 / 8, dtype=torch.bfloat16)
    x16 = x.to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, g * x16 + g * x16)
