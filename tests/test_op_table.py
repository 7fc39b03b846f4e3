"""docs/OPS.md is the registry's own table, and every op has what the registry promises."""

from pathlib import Path

from sx2torch.ops import REGISTRY
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
        assert op.result in ("float", "bool", "keep", "arith"), name
        assert all(
            a.kind
            in (
                "tensor",
                "matrix",
                "ids",
                "like",
                "bool-tensor",
                "tensors",
                "int",
                "number",
                "bool",
                "ints",
                "out",
                "reduction",
            )
            for a in op.args
        ), name
