"""docs/OPS.md is the registry's own table, and every op has what the registry promises."""

from pathlib import Path

import pytest

from sx2torch.ops import REGISTRY, Arg, ArgKind, Op, Result, register
from sx2torch.ops.rank import SAME
from sx2torch.ops.table import markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "OPS.md"


def test_the_committed_op_table_is_current():
    assert (
        DOC.read_text() == markdown()
    ), "regenerate it: python -m sx2torch.ops.table > docs/OPS.md"


def test_every_op_has_a_signature_an_emission_and_marks_in_one_entry():
    for name, op in REGISTRY.items():
        assert op.args, name
        assert (op.emit is None) != (op.expand is None), name
        assert isinstance(op.result, Result), name
        assert all(isinstance(a.kind, ArgKind) for a in (*op.args, *op.keys)), name


def test_an_entry_with_an_unknown_kind_or_result_is_refused():
    with pytest.raises(ValueError):
        Arg("x", "tensr")
    with pytest.raises(ValueError):
        register(
            Op(
                "no-such-op",
                (Arg("x"),),
                emit=lambda a, c: a[0],
                result="flaot",
                rank=SAME,
            )
        )
    assert "no-such-op" not in REGISTRY
