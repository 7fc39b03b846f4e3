"""The precision rules of LANGUAGE.md section 6, checked on generated modules.

Every expected value is written out by hand in plain PyTorch from the rule,
never by calling generated code. Data are integers chosen so that every GEMM
and sum is exact in f32 whatever the order of accumulation; then the only
roundings are the bf16 casts the rules call for, and the comparisons are
bitwise (dtype, shape and bits).

Two kinds of integer data appear:
- small integers (|v| <= 8) are bf16 values, so a cast down keeps them;
- "odd" integers in [259, 401] are not bf16 values (bf16 spacing is 2 there),
  so whether a value was cast down, or a parameter read from its f32 master
  or through a cast, shows in the result.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from bitwise import BF16, F32, assert_same, bits  # noqa: F401 (tests/bitwise.py)

POLICIES = ["f32", "bf16"]


# Helpers.


def small(*shape, seed=0, low=-4, high=5):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=generator).float()


def odd(*shape, seed=0):
    """Integers in [259, 401] with random signs: none is a bf16 value."""
    generator = torch.Generator().manual_seed(seed)
    magnitude = torch.randint(129, 200, shape, generator=generator) * 2 + 1
    sign = torch.randint(0, 2, shape, generator=generator) * 2 - 1
    return (magnitude * sign).float()


def make(build, body: str, precision: str | None, filename: str = "m.lisp"):
    """Compile `body` under a defrun of `precision` (None: no defrun) -> (class, code)."""
    source = body + (f"\n(defrun r :precision :{precision})\n" if precision else "\n")
    module, code = build(source, filename)
    return getattr(module, module.__all__[0]), code


def assign(net: torch.nn.Module, **values: torch.Tensor) -> None:
    with torch.no_grad():
        for name, value in values.items():
            getattr(net, name).copy_(value)


def down(t: torch.Tensor) -> torch.Tensor:
    return t.to(BF16)


def method_text(code: str, name: str) -> str:
    """The source text of one generated method."""
    match = re.search(
        rf"\n    def {re.escape(name)}\(self.*?(?=\n    (?:def |# )|\Z)", code, re.S
    )
    assert match, f"no method {name} in\n{code}"
    return match.group(0)


def specialization(code: str, defun: str, description: str) -> str:
    """The method name of the specialization whose comment is `# DEFUN for DESCRIPTION`."""
    match = re.search(
        rf"# {re.escape(defun)} for {re.escape(description)}\n\s+def (\w+)\(", code
    )
    assert match, f"no specialization '{defun} for {description}' in\n{code}"
    return match.group(1)


def data_sanity_rounds(value: torch.Tensor) -> None:
    """The test data must make a bf16 rounding visible, or the test proves nothing."""
    assert not torch.equal(
        value.to(BF16).float(), value
    ), "test data: every value is a bf16 value"


# 6.1 Policy: dtypes fixed when the file compiles; the chosen defrun decides.


def test_6_1_file_without_defrun_compiles_under_f32(build):
    cls, code = make(
        build, "(defparam w (zeros [4 3]))\n(defun forward (x) (matmul x w))", None
    )
    assert "precision f32" in code.splitlines()[0]
    assert ".to(torch.bfloat16)" not in code
    net = cls()
    w, x = small(4, 3, seed=1), odd(2, 4)
    assign(net, w=w)
    assert_same(net(x), x @ w)


def test_6_1_run_option_chooses_the_defrun(build):
    source = "(defparam w (zeros [4 3]))\n(defun forward (x) (matmul x w))\n(defrun a :precision :f32)\n(defrun b :precision :bf16)\n"
    w, x = small(4, 3, seed=1), odd(2, 4)
    for run, expected in (("a", x @ w), ("b", down(x) @ down(w)), (None, x @ w)):
        module, code = build(source, "m.lisp", run=run)
        net = module.M()
        assign(net, w=w)
        assert_same(net(x), expected)


# 6.2 The :bf16 policy: contagion.

CONTAGION = """
(defparam w (zeros [4 3]))
(defun pre (x) (* (+ x x) 0.5))
(defun meet (x) (matmul (* x 2.0) w))
(defun after (x) (+ (matmul x w) (slice x :axis 1 :start 0 :end 3)))
(defun forward (x) (meet x))
"""


@pytest.mark.parametrize("precision", POLICIES)
def test_6_2_value_stays_f32_until_it_meets_a_parameter_or_bf16(build, precision):
    cls, code = make(build, CONTAGION, precision)
    net = cls()
    w, x = small(4, 3, seed=1), odd(2, 4)
    assign(net, w=w)
    # Before the parameter: f32 under both policies (odd values survive).
    assert_same(net.pre(x), (x + x) * 0.5)
    if precision == "bf16":
        data_sanity_rounds(x * 2.0)
        # Meets the parameter: the f32 value is cast down, the product is bf16.
        assert_same(net.meet(x), down(x * 2.0) @ down(w))
        assert_same(net(x), down(x * 2.0) @ down(w))
        # A bf16 value meets an f32 one: the f32 one is cast down.
        assert_same(net.after(x), down(x) @ down(w) + down(x[:, 0:3]))
    else:
        assert_same(net.meet(x), (x * 2.0) @ w)
        assert_same(net(x), (x * 2.0) @ w)
        assert_same(net.after(x), x @ w + x[:, 0:3])
        assert ".to(torch.bfloat16)" not in code


@pytest.mark.parametrize("precision", POLICIES)
def test_6_2_scalars_never_decide_a_dtype(build, precision):
    body = """
(defconst scale 0.5)
(defparam w (zeros [4 3]))
(defun lit (x) (+ (* x 0.1) 1e-3))
(defun forward (x) (* (matmul x w) 2.0 scale))
"""
    cls, _ = make(build, body, precision)
    net = cls()
    w, x = small(4, 3, seed=1), odd(2, 4)
    assign(net, w=w)
    # f32 data with float literals: f32 under either policy, not rounded anywhere.
    assert_same(net.lit(x), x * 0.1 + 1e-3)
    if precision == "bf16":
        # A bf16 value times float literals and consts stays bf16.
        assert_same(net(x), down(x) @ down(w) * 2.0 * 0.5)
    else:
        assert_same(net(x), x @ w * 2.0 * 0.5)


@pytest.mark.parametrize("precision", POLICIES)
def test_6_2_parameter_read_through_one_cast_down_per_method(build, precision):
    body = """
(defparam w (zeros [4 4]))
(defun helper (x) (+ (matmul x w) w))
(defun forward (x) (+ (matmul (matmul x w) w) (helper x) w))
"""
    cls, code = make(build, body, precision)
    net = cls()
    w, x = small(4, 4, seed=1, low=-2, high=3), small(4, 4, seed=2, low=-2, high=3)
    assign(net, w=w)
    if precision == "bf16":
        for method in ("forward", "helper"):
            assert (
                method_text(code, method).count("self.w.to(torch.bfloat16)") == 1
            ), code
        wb, xb = down(w), down(x)
        expected = (xb @ wb) @ wb + (xb @ wb + wb) + wb
        assert_same(net(x), expected)
    else:
        assert "torch.bfloat16" not in code
        assert_same(net(x), (x @ w) @ w + (x @ w + w) + w)


@pytest.mark.parametrize("precision", POLICIES)
def test_6_2_integer_tensors_are_never_cast(build, precision):
    body = """
(defparam table (zeros [6 4]))
(defun lookup (ids) (take table ids))
(defun forward (ids labels) (cross-entropy (take table ids) labels))
"""
    cls, code = make(build, body, precision)
    net = cls()
    table = small(6, 4, seed=3)
    assign(net, table=table)
    ids = torch.tensor([[0, 5, 2], [1, 1, 4]])
    labels = torch.tensor([[3, 0, 1], [2, 2, 0]])
    assert not re.search(r"\b(ids|labels)\.(to|float)\(", code), code
    rows = table[ids].to(BF16) if precision == "bf16" else table[ids]
    assert_same(net.lookup(ids), rows)
    # cross-entropy's mark: the logits are read in f32, the labels as they are.
    logits = table[ids].reshape(-1, 4)
    got = net(ids.reshape(-1), labels.reshape(-1))
    assert_same(
        got,
        F.cross_entropy(
            logits.to(BF16).float() if precision == "bf16" else logits,
            labels.reshape(-1),
        ),
    )
    assert ids.dtype == torch.int64 and labels.dtype == torch.int64


@pytest.mark.parametrize("precision", POLICIES)
def test_6_2_one_hot_of_integers_is_f32_until_it_meets_a_parameter(build, precision):
    body = """
(defparam w (zeros [5 3]))
(defun codes (ids) (one-hot ids 5))
(defun forward (ids) (matmul (one-hot ids 5) w))
"""
    cls, _ = make(build, body, precision)
    net = cls()
    w = odd(5, 3, seed=4)
    assign(net, w=w)
    ids = torch.tensor([0, 4, 2])
    assert_same(net.codes(ids), F.one_hot(ids, 5).float())
    expected = (
        down(F.one_hot(ids, 5).float()) @ down(w)
        if precision == "bf16"
        else F.one_hot(ids, 5).float() @ w
    )
    assert_same(net(ids), expected)


# 6.3 Sensitive islands.

ISLAND = """
(defparam w (zeros [4 3]))
(defparam b (zeros [3]))
(defun island (x)
  (let ((h (matmul x w)))
    {open}(+ (exp (* h 0.125)) b){close}))
(defun forward (x)
  (let ((h (matmul x w))
        (s {open}(+ (exp (* h 0.125)) b){close}))
    (+ s h)))
"""
MARKED = ISLAND.format(open="(with-numerics (:sensitivity :high) ", close=")")
UNMARKED = ISLAND.format(open="", close="")


@pytest.mark.parametrize("precision", POLICIES)
def test_6_3_island_computes_in_f32_and_stays_f32_until_it_meets_bf16(build, precision):
    cls, code = make(build, MARKED, precision)
    # the island makes no GEMM: no autocast block (tests/emit/test_autocast_blocks.py)
    assert "# (with-numerics (:sensitivity :high) ...)" in code
    net = cls()
    w, b, x = small(4, 3, seed=1), odd(3, seed=5), small(2, 4, seed=2)
    assign(net, w=w, b=b)
    if precision == "bf16":
        h = down(x) @ down(w)
        # bf16 input cast up; the parameter read from its f32 master (odd values survive).
        s = torch.exp(h.float() * 0.125) + b
        assert_same(net.island(x), s)
        # The island's value meets a bf16 value: 6.2 applies, it is cast down.
        assert_same(net(x), down(s) + h)
    else:
        h = x @ w
        s = torch.exp(h * 0.125) + b
        assert_same(net.island(x), s)
        assert_same(net(x), s + h)


def test_6_3_island_under_f32_changes_nothing(build):
    marked, _ = make(build, MARKED, "f32")
    unmarked, _ = make(build, UNMARKED, "f32")
    generator = torch.Generator().manual_seed(0)
    w, b, x = (
        torch.randn(4, 3, generator=generator),
        torch.randn(3, generator=generator),
        torch.randn(2, 4, generator=generator),
    )
    one, other = marked(), unmarked()
    assign(one, w=w, b=b)
    assign(other, w=w, b=b)
    s = torch.exp((x @ w) * 0.125) + b
    for net in (one, other):
        assert_same(net.island(x), s)
        assert_same(net(x), s + x @ w)


def test_6_3_unmarked_under_bf16_differs(build):
    """The same model without the mark: the exp runs in bf16 and reads b cast down."""
    cls, _ = make(build, UNMARKED, "bf16")
    net = cls()
    w, b, x = small(4, 3, seed=1), odd(3, seed=5), small(2, 4, seed=2)
    assign(net, w=w, b=b)
    h = down(x) @ down(w)
    assert_same(net.island(x), torch.exp(h * 0.125) + down(b))


# 6.4 matmul.

MATMUL = """
(defparam w (zeros [8 3]))
(defun rounded (x) (matmul x w))
(defun wide (x) (matmul x w :out :f32))
(defun mm (a c) (matmul a c :out :f32))
(defun pair (x y) (mm (cast x :bf16) (cast y :bf16)))
(defun inside (x)
  (let ((h (matmul x w)))
    (with-numerics (:sensitivity :high) (matmul (slice h :axis 1 :start 0 :end 2) (slice w :axis 0 :start 0 :end 2)))))
(defun wide-plus (x) (+ (matmul x w :out :f32) (slice x :axis 1 :start 0 :end 3)))
(defun forward (x) (wide x))
"""


def matmul_data():
    x = small(5, 8, seed=6, low=-16, high=17)
    w = small(8, 3, seed=7, low=-16, high=17)
    return x, w


def test_6_4_bf16_matmul_rounds_its_product_on_store(build):
    cls, _ = make(build, MATMUL, "bf16")
    net = cls()
    x, w = matmul_data()
    assign(net, w=w)
    exact = x @ w  # exact: small integers
    data_sanity_rounds(exact)
    assert_same(net.rounded(x), exact.to(BF16))


def test_6_4_out_f32_on_bf16_operands_stores_the_f32_accumulator(build):
    cls, code = make(build, MATMUL, "bf16")
    assert "sx.matmul_f32_out" in code
    net = cls()
    x, w = matmul_data()
    assign(net, w=w)
    # The f32 product of the bf16 operands; exact for this integer data, so any
    # accumulation order gives these bits.
    assert_same(net.wide(x), down(x).float() @ down(w).float())
    assert_same(net(x), x @ w)


def test_6_4_out_f32_result_is_an_island_until_it_meets_bf16(build):
    cls, _ = make(build, MATMUL, "bf16")
    net = cls()
    x, w = odd(5, 8, seed=13), small(8, 3, seed=7, low=-16, high=17)
    assign(net, w=w)
    # The f32 accumulator meets an f32 value: f32, and x's odd values survive outside the GEMM.
    assert_same(net.wide_plus(x), down(x).float() @ down(w).float() + x[:, 0:3])


def test_6_4_out_f32_gradients_reach_bf16_operands_as_bf16(build):
    cls, code = make(build, MATMUL, "bf16")
    net = cls()
    # the program calls mm only with bf16: one method under its name, casting at entry
    name = "mm"
    assert "a = a.to(torch.bfloat16)" in method_text(code, name)
    a = small(64, 8, seed=8, low=0, high=21).to(BF16).requires_grad_()
    c = small(8, 3, seed=9, low=0, high=21).to(BF16).requires_grad_()
    out = getattr(net, name)(a, c)
    assert out.dtype == F32
    out.sum().backward()
    ones = torch.ones(64, 3)
    assert_same(a.grad, (ones @ c.detach().float().T).to(BF16))
    exact = a.detach().float().T @ ones  # column sums up to 1280: not all bf16 values
    data_sanity_rounds(exact)
    assert_same(c.grad, exact.to(BF16))


def test_6_4_out_f32_master_weight_gradient_went_through_bf16(build):
    """The gradient reaches the bf16 operand (the cast-down weight) as bf16, then the master as f32."""
    cls, _ = make(build, MATMUL, "bf16")
    net = cls()
    x = small(64, 8, seed=8, low=0, high=21)
    net.wide(x).sum().backward()
    exact = x.T @ torch.ones(64, 3)
    data_sanity_rounds(exact)
    assert net.w.grad.dtype == F32
    assert_same(net.w.grad, exact.to(BF16).float())


def test_6_4_out_f32_on_f32_operands_changes_no_value(build):
    cls, code = make(build, MATMUL, "f32")
    assert "matmul_f32_out" not in code
    net = cls()
    generator = torch.Generator().manual_seed(0)
    w, x = torch.randn(8, 3, generator=generator), torch.randn(
        5, 8, generator=generator
    )
    assign(net, w=w)
    assert_same(net.wide(x), net.rounded(x))
    assert_same(net.wide(x), x @ w)


def test_6_4_matmul_inside_an_island_casts_its_operands_up(build):
    cls, _ = make(build, MATMUL, "bf16")
    net = cls()
    x = small(5, 8, seed=6, low=-2, high=3)
    w = odd(8, 3, seed=10)
    assign(net, w=w)
    h = down(x) @ down(w)
    # f32 GEMM of h (cast up) and the master weight (odd values survive); exact integers.
    assert_same(net.inside(x), h.float()[:, 0:2] @ w[0:2, :])


def test_6_4_out_f32_under_f32_policy_on_bf16_operands_is_their_f32_product(build):
    cls, code = make(build, MATMUL, "f32")
    net = cls()
    x, y = odd(5, 8, seed=11), small(8, 3, seed=12)
    assert_same(net.pair(x, y), down(x).float() @ down(y).float())


# 6.5 bf16 regions.

REGION = """
(defparam w (zeros [4 4]))
(defun region (x) (with-numerics (:precision :bf16) (matmul x w)))
(defun forward (x)
  (let ((r (with-numerics (:precision :bf16) (matmul x w))))
    (+ r x)))
"""


def test_6_5_region_under_f32_computes_bf16_and_its_reader_casts_back_up(build):
    cls, code = make(build, REGION, "f32")
    assert "with sx.bf16_region():" in code
    net = cls()
    w, x = small(4, 4, seed=1, low=-2, high=3), odd(3, 4, seed=2)
    assign(net, w=w)
    r = down(x) @ down(w)
    assert_same(net.region(x), r)
    assert_same(net(x), r.float() + x)  # x outside the region keeps its odd value


def test_6_5_region_under_bf16_policy(build):
    cls, _ = make(build, REGION, "bf16")
    net = cls()
    w, x = small(4, 4, seed=1, low=-2, high=3), odd(3, 4, seed=2)
    assign(net, w=w)
    r = down(x) @ down(w)
    assert_same(net.region(x), r)
    assert_same(net(x), r + down(x))


NESTED = """
(defparam w (zeros [4 4]))
(defun island-in-region (x)
  (with-numerics (:precision :bf16)
    (let ((h (matmul x w)))
      (with-numerics (:sensitivity :high) (matmul h w)))))
(defun region-in-island (x)
  (with-numerics (:sensitivity :high)
    (let ((h (matmul x w)))
      (with-numerics (:precision :bf16) (matmul h w)))))
(defun softmax-in-region (x)
  (with-numerics (:precision :bf16) (softmax (matmul x w))))
(defun forward (x) (island-in-region x))
"""


@pytest.mark.parametrize("precision", POLICIES)
def test_6_5_innermost_form_wins(build, precision):
    cls, _ = make(build, NESTED, precision)
    net = cls()
    x, w = small(3, 4, seed=3, low=-2, high=3), odd(4, 4, seed=4)
    assign(net, w=w)
    # An island inside a region: f32, its bf16 input cast up, the master read.
    h = down(x) @ down(w)
    assert_same(net.island_in_region(x), h.float() @ w)
    # A region inside an island: the island's f32 value and the weight cast down.
    h = x @ w  # exact integers, f32
    data_sanity_rounds(h)
    assert_same(net.region_in_island(x), down(h) @ down(w))
    # The library's mark keeps softmax f32 inside a region.
    assert_same(
        net.softmax_in_region(x), torch.softmax((down(x) @ down(w)).float(), dim=-1)
    )


def test_6_5_region_around_a_whole_model_is_not_the_bf16_policy(build):
    body = """
(defparam w (zeros [4 4]))
(defun forward (x) %s)
"""
    model = "(matmul (+ x 1.0) w)"
    region_cls, _ = make(
        build, body % f"(with-numerics (:precision :bf16) {model})", "f32"
    )
    policy_cls, _ = make(build, body % model, "bf16")
    w = torch.eye(4)
    x = torch.full((2, 4), 257.0)
    region, policy = region_cls(), policy_cls()
    assign(region, w=w)
    assign(policy, w=w)
    # In the region x is cast down at once: 257 -> 256, then 256 + 1 -> 256 (a tie, to even).
    assert_same(region(x), (down(x) + 1.0) @ down(w))
    assert torch.all(region(x) == 256)
    # Under :bf16, x + 1 stays f32 (258) until it meets w, then 258 is a bf16 value.
    assert_same(policy(x), down(x + 1.0) @ down(w))
    assert torch.all(policy(x) == 258)


# 6.6 Determinism.


@pytest.mark.parametrize("precision", POLICIES)
def test_6_6_same_bits_run_after_run(build, precision):
    body = """
(defparam w1 (normal [16 32] :std 0.2))
(defparam w2 (normal [32 8] :std 0.2))
(defun forward (x)
  (let ((h (with-numerics (:precision :bf16) (gelu (matmul x w1))))
        (n (rms-norm (+ h 0.5))))
    (softmax (matmul n w2 :out :f32))))
"""
    cls, _ = make(build, body, precision)
    torch.manual_seed(0)
    one = cls()
    torch.manual_seed(0)
    two = cls()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    first = one(x)
    assert_same(one(x), first)
    assert_same(two(x), first)


def test_6_6_bf16_rounding_is_nearest_even(build):
    """Every rounding is one cast, nearest-even: ties at 257 -> 256, 259 -> 260, 1 + 2^-8 -> 1."""
    cls, _ = make(build, "(defparam w (ones [1]))\n(defun forward (x) (* x w))", "bf16")
    net = cls()
    x = torch.tensor([257.0, 259.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -257.0])
    assert_same(
        net(x), torch.tensor([256.0, 260.0, 1.0, 1.0 + 2.0**-6, -256.0]).to(BF16)
    )


# 6.7 Parameters.


def test_6_7_numerics_high_readers_compute_f32_from_the_master(build):
    body = """
(defparam w (zeros [4 4]))
(defparam hi (zeros [4 3]) :numerics :high)
(defun forward (x) (matmul (matmul x w) hi))
"""
    cls, code = make(build, body, "bf16")
    assert "self.hi.to(" not in code
    net = cls()
    x, w, hi = (
        small(2, 4, seed=1, low=-2, high=3),
        small(4, 4, seed=2, low=-2, high=3),
        odd(4, 3, seed=3),
    )
    assign(net, w=w, hi=hi)
    out = net(x)
    assert_same(out, (down(x) @ down(w)).float() @ hi)
    out.sum().backward()
    assert net.hi.grad.dtype == F32 and net.w.grad.dtype == F32


FROZEN = """
(defparam f (normal [4 4]) :trainable false)
(defparam g (normal [4 4]) :trainable false)
(defparam hi (normal [4 4]) :trainable false :numerics :high)
(defparam r (normal [4 4]) :trainable false)
(defparam both (normal [4 4]) :trainable false)
(defparam t (normal [4 4]) :trainable true)
(defun forward (x)
  (let ((a (matmul x f))
        (b (with-numerics (:sensitivity :high) (matmul x g)))
        (c (matmul x hi))
        (d (with-numerics (:precision :bf16) (matmul x r)))
        (e (+ (with-numerics (:precision :bf16) (matmul x both)) (matmul x both))))
    (+ a b c d e (matmul x t))))
"""


def test_6_7_frozen_parameters_stored_in_their_readers_dtype_under_bf16(build):
    cls, _ = make(build, FROZEN, "bf16")
    state = cls().state_dict()
    stored = {name: state[name].dtype for name in ("f", "g", "hi", "r", "both", "t")}
    # f: plain readers only; r and both: read in regions and plainly (bf16 under :bf16).
    # g: a sensitive node reads it; hi: :numerics :high; t: trained, an f32 master.
    assert stored == {"f": BF16, "g": F32, "hi": F32, "r": BF16, "both": BF16, "t": F32}
    assert set(dict(cls().named_buffers())) == {"f", "g", "hi", "r", "both"}


def test_6_7_frozen_parameters_stored_in_their_readers_dtype_under_f32(build):
    cls, _ = make(build, FROZEN, "f32")
    state = cls().state_dict()
    stored = {name: state[name].dtype for name in ("f", "g", "hi", "r", "both", "t")}
    # Only r is read only inside bf16 regions.
    assert stored == {"f": F32, "g": F32, "hi": F32, "r": BF16, "both": F32, "t": F32}


@pytest.mark.parametrize("precision", POLICIES)
def test_6_7_frozen_bf16_parameter_gives_the_same_bits_as_the_cast(build, precision):
    cls, _ = make(build, FROZEN, precision)
    torch.manual_seed(0)
    net = cls()
    torch.manual_seed(0)
    drawn = {
        name: torch.normal(0.0, 1.0, size=(4, 4))
        for name in ("f", "g", "hi", "r", "both", "t")
    }
    # Rounded once when made, nearest-even.
    assert_same(net.r, drawn["r"].to(BF16))
    x = small(2, 4, seed=5, low=-2, high=3)
    if precision == "bf16":
        xb = down(x)
        a = xb @ down(drawn["f"])
        b = x @ drawn["g"]  # a sensitive reader: f32
        c = x @ drawn["hi"]  # :numerics :high: f32
        d = xb @ down(drawn["r"])
        e = xb @ down(drawn["both"]) + xb @ down(drawn["both"])
        # (+ a b c d e ...) folds left; each f32 operand meets bf16 and is cast down.
        expected = (((a + down(b)) + down(c)) + d) + e + xb @ down(drawn["t"])
    else:
        d = down(x) @ down(drawn["r"])
        e = (down(x) @ down(drawn["both"])).float() + x @ drawn["both"]
        expected = (
            x @ drawn["f"]
            + x @ drawn["g"]
            + x @ drawn["hi"]
            + d.float()
            + e
            + x @ drawn["t"]
        )
    assert_same(net(x), expected)


@pytest.mark.parametrize("precision", POLICIES)
def test_6_7_load_state_dict_rounds_into_a_bf16_buffer(build, precision):
    cls, _ = make(
        build,
        "(defparam r (zeros [6]) :trainable false)\n(defun forward (x) (with-numerics (:precision :bf16) (* x r)))",
        precision,
    )
    net = cls()
    assert net.r.dtype == BF16
    values = torch.tensor(
        [257.0, 259.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -0.1, 3.4e38]
    )
    net.load_state_dict({"r": values})
    assert_same(net.r, values.to(BF16))
    assert_same(
        net.r,
        torch.tensor([256.0, 260.0, 1.0, 1.0 + 2.0**-6, -0.1, float("inf")]).to(BF16),
    )
    assert_same(net(torch.ones(6)), values.to(BF16))


def test_6_7_state_dict_keys_use_underscores(build):
    body = """
(defmodel block (&key (d 4))
  (defparam w-q (zeros [d d]))
  (defun forward (x) (matmul x w-q)))
(defparam w-in (zeros [4 4]))
(defparam frozen-table (zeros [4 4]) :trainable false)
(defparam blocks (stack 2 (block :d 4)))
(defun forward (x) (matmul (chain blocks (matmul x w-in)) frozen-table))
"""
    cls, _ = make(build, body, "bf16")
    assert set(cls().state_dict()) == {
        "w_in",
        "frozen_table",
        "blocks.0.w_q",
        "blocks.1.w_q",
    }


def test_6_7_master_weight_gradients_are_f32(build):
    body = """
(defparam w (normal [4 4]))
(defparam b (zeros [4]))
(defun forward (x labels) (cross-entropy (+ (matmul x w) b) labels))
"""
    cls, _ = make(build, body, "bf16")
    net = cls()
    loss = net(torch.randn(3, 4), torch.tensor([0, 1, 3]))
    assert loss.dtype == F32
    loss.backward()
    assert net.w.dtype == F32 and net.w.grad.dtype == F32
    assert net.b.dtype == F32 and net.b.grad.dtype == F32


# 6.8 Library marks.

LIBRARY = """
(defparam w (zeros [4 6]))
(defun h (x) (matmul x w))
(defun sm (x) (softmax (h x)))
(defun lsm (x) (log-softmax (h x) :axis 0))
(defun lse (x) (logsumexp (h x) :axes [-1]))
(defun ce (x labels) (cross-entropy (h x) labels))
(defun cap (x) (softcap (h x) 2.5))
(defun rms (x) (rms-norm (h x)))
(defun ln (x) (layer-norm (h x)))
(defun bn (x) (batch-norm (h x)))
(defun forward (x) (h x))
"""


def library_net(build, precision):
    cls, code = make(build, LIBRARY, precision)
    net = cls()
    w = small(4, 6, seed=21, low=-3, high=4)
    assign(net, w=w)
    x = small(5, 4, seed=22, low=-3, high=4)
    return net, x, w, code


@pytest.mark.parametrize("precision", POLICIES)
def test_6_8_softmax_family_computes_in_f32(build, precision):
    net, x, w, code = library_net(build, precision)
    h = (
        (down(x) @ down(w)).float() if precision == "bf16" else x @ w
    )  # exact integers either way
    labels = torch.tensor([0, 5, 2, 3, 1])
    assert_same(net.sm(x), torch.softmax(h, dim=-1))
    assert_same(net.lsm(x), torch.log_softmax(h, dim=0))
    assert_same(net.lse(x), torch.logsumexp(h, dim=-1))
    assert_same(net.ce(x, labels), F.cross_entropy(h, labels))
    assert_same(net.cap(x), 2.5 * torch.tanh(h / 2.5))
    assert method_text(code, "sm").count("# (softmax (h x))") == 1


def test_6_8_rms_norm_statistics_f32_final_multiply_bf16(build):
    net, x, w, _ = library_net(build, "bf16")
    h = down(x) @ down(w)
    hf = h.float()
    inverse = torch.rsqrt(torch.mean(hf * hf, dim=-1, keepdim=True) + 1e-6)
    expected = h * inverse.to(BF16)  # rsqrt rounded to bf16 before the bf16 multiply
    assert_same(net.rms(x), expected)


def test_6_8_rms_norm_under_f32(build):
    net, x, w, _ = library_net(build, "f32")
    h = x @ w
    assert_same(
        net.rms(x), h * torch.rsqrt(torch.mean(h * h, dim=-1, keepdim=True) + 1e-6)
    )


@pytest.mark.parametrize("op, axis", [("ln", -1), ("bn", 0)])
def test_6_8_layer_norm_and_batch_norm_statistics_f32(build, op, axis):
    net, x, w, _ = library_net(build, "bf16")
    h = down(x) @ down(w)
    hf = h.float()
    mean = torch.mean(hf, dim=axis, keepdim=True)
    var = torch.mean(torch.square(hf - mean), dim=axis, keepdim=True)
    inverse = torch.rsqrt(var + 1e-5)
    # Centring and scaling are not marked: bf16, reading the f32 statistics cast down.
    expected = (h - down(mean)) * down(inverse)
    assert_same(getattr(net, op)(x), expected)


@pytest.mark.parametrize("op, axis", [("ln", -1), ("bn", 0)])
def test_6_8_layer_norm_and_batch_norm_under_f32(build, op, axis):
    net, x, w, _ = library_net(build, "f32")
    h = x @ w
    mean = torch.mean(h, dim=axis, keepdim=True)
    var = torch.mean(torch.square(h - mean), dim=axis, keepdim=True)
    assert_same(getattr(net, op)(x), (h - mean) * torch.rsqrt(var + 1e-5))


# Defuns: one method per dtype signature; a call inside with-numerics takes its mark.

SPECIALIZE = """
(defparam w (zeros [4 4]))
(defun f (x) (* (exp x) 2.0))
(defun two (x) (+ (f x) (f (matmul x w))))
(defun marked (x) (with-numerics (:sensitivity :high) (f (matmul x w))))
(defun regioned (x) (with-numerics (:precision :bf16) (f x)))
(defun forward (x) (two x))
"""


def test_defun_gets_one_method_per_dtype_signature(build):
    cls, code = make(build, SPECIALIZE, "bf16")
    assert len(re.findall(r"\n    def f(_\w+)?\(self", code)) >= 2, code
    net = cls()
    x, w = small(3, 4, seed=1, low=-2, high=3) / 4, small(4, 4, seed=2, low=-2, high=3)
    assign(net, w=w)
    h = down(x) @ down(w)
    # (f x): f32 argument, f32 method; (f h): bf16 argument, bf16 method.
    assert_same(net.f(x), torch.exp(x) * 2.0)
    assert_same(net(x), down(torch.exp(x) * 2.0) + torch.exp(h) * 2.0)


NEGATION = """
(defparam w (zeros [4 4]))
(defun rot (x s) (+ (* x s) (* x (- s))))
(defun g (x s) (+ (rot (matmul x w) s) s))
(defun forward (x s) (g x (cast s :bf16)))
(defrun r :precision :bf16)
"""


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_a_negation_read_in_bf16_is_cast_before_it_and_one_method_serves_both(
    build, target
):
    """`(- s)` of an f32 `s`, read only by bf16 products, negates `s` cast down: the bits
    of negating in f32 and rounding, in the code a bf16 `s` gives, so one method of `rot`
    (and of `g`) serves f32 and bf16 `s`. `s` keeps a cast per read, so the gradient of an
    f32 `s` is summed in f32 as two casts sum it."""
    module, code = build(NEGATION, target=target)
    assert re.findall(r"\n    def (\w+)\(", code) == ["__init__", "rot", "g", "forward"]
    cast = "-s.to(torch.bfloat16)" if target == "cuda" else "-sx.round_to_bf16(s)"
    assert cast in method_text(code, "rot"), code
    net = module.Model()
    w = small(4, 4, seed=1, low=-2, high=3)
    assign(net, w=w)
    for method, s_read in (("forward", lambda s: down(s)), ("g", lambda s: s)):
        x = small(3, 4, seed=2, low=-2, high=3).requires_grad_()
        s = odd(3, 4, seed=3).requires_grad_()
        data_sanity_rounds(s)
        net.zero_grad()
        y = getattr(net, method)(x, s)
        y.float().sum().backward()
        xr, sr, wr = (t.detach().clone().requires_grad_() for t in (x, s, w))
        h, s_in = down(xr) @ down(wr), s_read(sr)
        expected = (h * down(s_in) + h * down(-s_in)) + down(s_in)
        expected.float().sum().backward()
        assert_same(y, expected if target == "cuda" else expected.float())
        for got, want in ((x, xr), (s, sr), (net.w, wr)):
            assert_same(got.grad, want.grad)


@pytest.mark.parametrize("precision", POLICIES)
def test_defun_called_inside_with_numerics_computes_with_that_mark(build, precision):
    cls, code = make(build, SPECIALIZE, precision)
    net = cls()
    x, w = small(3, 4, seed=1, low=-2, high=3) / 4, small(4, 4, seed=2, low=-2, high=3)
    assign(net, w=w)
    h = (down(x) @ down(w)).float() if precision == "bf16" else x @ w
    assert_same(net.marked(x), torch.exp(h) * 2.0)
    assert_same(net.regioned(x), torch.exp(down(x)) * 2.0)


def test_defun_called_only_with_bf16_may_chain_a_stack(build):
    """Regression: the f32 specialization, used only to name methods, raised a spurious error."""
    body = """
(defmodel block (&key (d 4))
  (defparam w (zeros [d d]))
  (defun forward (x) (matmul x w)))
(defparam blocks (stack 2 (block :d 4)))
(defparam w0 (zeros [4 4]))
(defun run-blocks (x) (chain blocks x))
(defun forward (x) (run-blocks (matmul x w0)))
"""
    cls, _ = make(build, body, "bf16")
    net = cls()
    w0, w1, w2 = (small(4, 4, seed=s, low=-2, high=3) for s in (1, 2, 3))
    assign(net, w0=w0)
    assign(net.blocks[0], w=w1)
    assign(net.blocks[1], w=w2)
    x = small(3, 4, seed=4, low=-2, high=3)
    assert_same(net(x), ((down(x) @ down(w0)) @ down(w1)) @ down(w2))


@pytest.mark.parametrize("precision", POLICIES)
def test_6_2_where_of_number_literals_is_f32_until_it_meets_bf16(build, precision):
    """Regression: the condition's dtype (bool) was taken for the output's."""
    body = """
(defparam w (zeros [4 4]))
(defun mask (x) (where (> x 0) 1.0 0.0))
(defun forward (x) (* (where (> x 0) 1.0 0.0) (matmul x w)))
"""
    cls, _ = make(build, body, precision)
    net = cls()
    w, x = small(4, 4, seed=1), small(3, 4, seed=2)
    assign(net, w=w)
    mask = torch.where(x > 0, 1.0, 0.0)
    assert_same(net.mask(x), mask)
    expected = (
        down(mask) * (down(x) @ down(w)) if precision == "bf16" else mask * (x @ w)
    )
    assert_same(net(x), expected)


def test_6_5_where_of_number_literals_in_a_region_is_bf16(build):
    cls, _ = make(
        build,
        "(defun forward (x) (with-numerics (:precision :bf16) (where (> x 0) 1.0 0.0)))",
        "f32",
    )
    x = small(3, 4, seed=2)
    assert_same(cls()(x), torch.where(x > 0, 1.0, 0.0).to(BF16))


def test_6_7_numerics_high_parameter_inside_a_region_is_still_read_in_f32(build):
    """6.7 says a node that reads a :numerics :high parameter computes in f32; a region does not override it."""
    body = """
(defparam hi (zeros [4 3]) :numerics :high)
(defun forward (x) (with-numerics (:precision :bf16) (matmul x hi)))
"""
    cls, _ = make(build, body, "f32")
    net = cls()
    x, hi = small(2, 4, seed=1, low=-2, high=3), odd(4, 3, seed=3)
    assign(net, hi=hi)
    assert_same(net(x), x @ hi)


SCANS = """
(defparam w (zeros [4 4]))
(defun scan (x) (linear-scan (sigmoid (matmul x w)) (matmul x w)))
(defun ortho (g) (newton-schulz (matmul g w)))
(defun forward (x) (scan x))
"""


def _newton_schulz_reference(g):
    """LANGUAGE.md 5: Muon's quintic iteration on G / (|G|_F + 1e-7), in bf16 (6.8), returning f32."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.to(BF16)
    tall = g.shape[-2] > g.shape[-1]
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(5):
        m = x @ x.mT
        x = a * x + (b * m + c * m @ m) @ x
    if tall:
        x = x.mT
    return x.float()


@pytest.mark.parametrize("precision", POLICIES)
def test_6_8_linear_scan_computes_in_f32(build, precision):
    cls, _ = make(build, SCANS, precision)
    net = cls()
    w, x = small(4, 4, seed=1, low=-2, high=3) / 4, small(
        2, 5, 4, seed=2, low=-2, high=3
    )
    assign(net, w=w)
    h = down(x) @ down(w) if precision == "bf16" else x @ w
    a, b = torch.sigmoid(h).float(), h.float()  # the scan reads its bf16 inputs cast up
    state, steps = torch.zeros(2, 4), []
    for t in range(5):
        state = a[:, t] * state + b[:, t]
        steps.append(state)
    got = net.scan(x)
    assert got.dtype == F32
    # A tolerance: the contract does not fix the order in which a scan associates
    # its products (a parallel scan may regroup them); the dtype is exact.
    torch.testing.assert_close(got, torch.stack(steps, dim=1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("precision", POLICIES)
def test_6_8_newton_schulz_iterates_in_bf16_and_returns_f32(build, precision):
    cls, _ = make(build, SCANS, precision)
    net = cls()
    w, g = small(4, 4, seed=1, low=-2, high=3), small(6, 4, seed=3, low=-2, high=3)
    assign(net, w=w)
    h = down(g) @ down(w) if precision == "bf16" else g @ w
    assert_same(net.ortho(g), _newton_schulz_reference(h))


def test_6_7_a_shape_read_inside_gradient_does_not_keep_a_frozen_parameter_f32(build):
    """The backward of a sum of an f32-out product starts from ones shaped by `w1`, which
    reads only its shape: every value read is `w1` cast down, so it is stored bf16, as
    without `:out :f32` (issue 40 item 8; it was stored f32, twice the memory)."""
    body = (
        "(defparam w1 (normal [4 4]) :trainable false)\n"
        "(defun grad-x (x) (gradient (sum (matmul (matmul x w1 :out :f32) w1)) x))\n"
        "(defun forward (x) x)"
    )
    cls, _ = make(build, body, "bf16")
    net = cls()
    assert net.state_dict()["w1"].dtype == BF16
    x = torch.randn(3, 4)
    w = net.w1.to(BF16)
    ones = torch.ones(3, 4, dtype=BF16)  # d(sum)/d(product), then two bf16 GEMMs back
    assert_same(net.grad_x(x), ones @ w.T @ w.T)
