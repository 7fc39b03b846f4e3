"""--dump-after prints each intermediate form; every specialization keeps the policy's invariants
under both precisions (tests/driver/test_pipeline.py verifies each pass under the source's own run).
"""

import pytest

from sx2torch import compiler
from sx2torch.compiler import Options, Unit
from sx2torch.cli import main

from cases import EXAMPLES, SOURCES as CASES


def test_each_pass_can_be_printed(capsys):
    path = str(EXAMPLES / "rms-mlp.lisp")
    expected = {
        "read": "2:1 (require sexpgpu/nn)",
        "resolve": "  param w1 = normal(shape=[d-in=784 d-hidden=256], std=0.02, mean=0)",
        "trace": "  %4 = rsqrt(%3) [island]  @16:8",
        "ranks": "  %3 = cross-entropy(%2, %1) [island library] : []  @23:3",
        "policy": "  %8 = matmul(%6, %7) out=f32 : bf16 -> f32  @20:5",
        "plan": "  %2 = matmul(%0, %1) read 0 to-bf16 read 1 by name  @19:21",
        "names": "  w1_bf16 = %1 as bf16",
    }
    for stage, line in expected.items():
        assert main([path, "--dump-after", stage]) == 0
        assert line in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("precision", ["f32", "bf16"])
@pytest.mark.parametrize("source", CASES, ids=[c.stem for c in CASES])
def test_every_specialization_verifies_after_the_policy(source, precision):
    """The passes run as a compile runs them, through `functions` (whose output emit reads),
    for a defrun of `precision` added to the source; each pass's output is verified (the
    policy's and the functions pass's: every specialization keeps the policy's invariants).
    """
    text = f"{source.read_text()}\n(defrun policy-check :precision :{precision})\n"
    unit = Unit(text, source.name, Options(run="policy-check"))
    assert compiler.run(unit, until="policy", verify=True).lowered.specializations


@pytest.mark.parametrize(
    "name, stage, line",
    [
        # a parameter passed as an argument
        ("distill", "policy", "distill.project(%0 x, %1 w) : (f32, param teacher)"),
        ("distill", "names", "Distill.project <- distill.project(f32, param teacher)"),
        # a loop's carried value of unknown rank whose last size is known (not a literal)
        ("exact-keys", "ranks", "layer=layer : ([... ?])"),
        # a member read through a sub-model
        ("modded-nanogpt-medium", "trace", "via=[[modded-nanogpt-medium lm-head]]"),
    ],
)
def test_a_dump_prints_what_was_an_internal_error(name, stage, line, capsys):
    (source,) = [c for c in CASES if c.stem == name]
    assert main([str(source), "--dump-after", stage]) == 0
    assert line in capsys.readouterr().out
