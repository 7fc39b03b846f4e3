"""docs/OPS.md is the registry's own table, and every op has what the registry promises."""

from pathlib import Path

import pytest

from sx2torch.ops import REGISTRY, Arg, ArgKind, Op, Result, register
from sx2torch.ops.rank import SAME
from sx2torch.tools.ops_table import markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "OPS.md"


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
