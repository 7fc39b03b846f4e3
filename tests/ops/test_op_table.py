"""docs/OPS.md is the registry's own table, and every op has what the registry promises."""

import re
from pathlib import Path

import pytest

import sx2torch.build as b
from sx2torch.ir import DType
from sx2torch.ops import REGISTRY, Arg, ArgKind, EmitContext, Op, Result, register
from sx2torch.ops.rank import SAME, RankRule
from sx2torch.ops.registry import UNCAST
from sx2torch.syntax import scalars
from sx2torch.syntax.scalars import Scalar
from sx2torch.tools.ops_table import markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "OPS.md"


def test_the_committed_op_table_is_current():
    assert (
        DOC.read_text() == markdown()
    ), "regenerate it: python -m sx2torch.tools.ops_table > docs/OPS.md"


def test_every_op_has_a_signature_an_emission_and_marks_in_one_entry():
    for name, op in REGISTRY.items():
        assert op.args, name
        assert (op.emit is None) != (op.expand is None), name
        assert isinstance(op.result, Result), name
        assert all(isinstance(a.kind, ArgKind) for a in (*op.args, *op.keys)), name


def test_every_op_has_a_rank_rule_and_each_fact_in_its_entry_is_of_its_kind():
    """The parts `register` does not refuse missing: each is a field of the entry, of the
    type its readers take (a rank rule with its table text, exactness as a flag or a test
    of the operands, a risk as the warning's words), and only an n-ary op folds."""
    for name, op in REGISTRY.items():
        assert isinstance(op.rank, RankRule) and op.rank.doc, name
        assert isinstance(op.exact, bool) or callable(op.exact), name
        assert isinstance(op.negation, bool) or callable(op.negation), name
        assert isinstance(op.bf16_risk, str) and isinstance(op.no_grad, str), name
        assert not op.folds or op.bounds[1] is None, name
        assert op.out_dtype is None or callable(op.out_dtype), name
        assert isinstance(op.fills, bool) and isinstance(op.constant, bool), name
        assert isinstance(op.total, bool) or callable(op.total), name
        assert op.identity is None or type(op.identity) is int, name
        assert op.spread is None or callable(op.spread), name
        assert op.ones_from is None or callable(op.ones_from), name
        assert all(isinstance(f, bool) for f in (op.ones, op.checks, op.gathers)), name
        assert not op.ones or op.fills and op.constant, name  # ones are a constant fill


def test_an_op_said_to_fill_is_emitted_as_a_fill_in_its_compute_dtype():
    """A cast of a fill is written as the fill made in the wanted dtype
    (sx2torch/plan/targets.py): so each op said to fill must emit exactly that."""
    fill = re.compile(r"torch\.(ones|zeros)_like\(x, dtype=torch\.bfloat16\)")
    for name, op in REGISTRY.items():
        if op.fills:
            code = b.code(op.emit([b.name("x")], EmitContext("cuda", "bf16")))
            assert fill.fullmatch(code), name
    assert {n for n, op in REGISTRY.items() if op.fills} == {"ones-like", "zeros-like"}


def test_a_constant_op_reads_its_operands_for_their_shapes_only():
    """The policy makes a constant op in the dtype its readers read it in and keeps how it
    reads its own operands as found before (sx2torch/policy/rules.py, `_finish`): so it
    must read none of them as data."""
    constant = [op for op in REGISTRY.values() if op.constant]
    assert constant
    for op in constant:
        assert all(arg.kind in UNCAST for arg in op.args), op.name


def test_an_entry_with_an_unknown_kind_or_result_is_refused():
    with pytest.raises(ValueError):
        Arg("x", "tensr")
    with pytest.raises(ValueError, match="flaot"):
        register(
            Op(
                "no-such-op",
                (Arg("x"),),
                emit=lambda a, c: a[0],
                result="flaot",
                rank=SAME,
                no_grad="a test entry",
            )
        )
    assert "no-such-op" not in REGISTRY


def test_every_op_has_a_derivative_or_says_why_not():
    for name, op in REGISTRY.items():
        assert op.grad or op.expand or op.no_grad or op.internal, name
        assert not (op.grad and op.no_grad), name


def test_an_entry_without_a_derivative_or_a_reason_is_refused():
    with pytest.raises(ValueError, match="derivative rule"):
        register(Op("no-such-op", (Arg("x"),), emit=lambda a, c: a[0], rank=SAME))
    assert "no-such-op" not in REGISTRY


def test_every_op_the_language_folds_on_numbers_folds_through_its_entry():
    """Arithmetic, comparisons and functions of one number fold on compile-time scalars by
    their entry's `numbers`, to the value Python computes; any other op has none."""
    words = {
        *scalars.ARITHMETIC,
        *scalars.COMPARISONS,
        *scalars.FUNCTIONS,
        "pow",
        "neg",
    }
    folded = {name for name, op in REGISTRY.items() if op.numbers}
    # every word but `**`, which the library writes `pow`; and a list's `at` and `len`
    assert folded == words - {"**"} | {"at", "len"}
    depths = Scalar.lit((3, 3, 9, 3))
    assert REGISTRY["at"].numbers([depths], None, i=Scalar.lit(-2)).value == 9
    assert REGISTRY["len"].numbers([depths], None).value == 4
    two, three = Scalar.lit(2), Scalar.lit(3)
    assert REGISTRY["-"].numbers([two, three], None).value == -1
    assert REGISTRY["-"].numbers([two], None).value == -2
    assert REGISTRY["neg"].numbers([three], None).value == -3
    assert REGISTRY["mod"].numbers([three, two], None).value == 1
    assert REGISTRY["pow"].numbers([two, three], None).value == 8
    assert REGISTRY["<="].numbers([three, two], None).value is False
    assert REGISTRY["sqrt"].numbers([Scalar.lit(9.0)], None).value == 3.0


def test_an_op_whose_key_chooses_its_dtype_says_so_in_its_entry():
    """The f32-out matmul's `:out :f32` is a fact of matmul's entry, read by the policy."""
    chooses = {
        name
        for name, op in REGISTRY.items()
        if any(k.kind is ArgKind.OUT for k in op.keys)
    }
    assert chooses == {name for name, op in REGISTRY.items() if op.out_dtype}
    for name in chooses:
        assert REGISTRY[name].out_dtype({"out": "f32"}) is DType.F32
        assert REGISTRY[name].out_dtype({"out": None}) is None
