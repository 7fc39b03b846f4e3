"""benchmarks/gpu.py runs on the CPU: every section, its table and its JSON."""

import json

from benchmarks import gpu


def test_the_gpu_check_runs_on_the_cpu(tmp_path, capsys):
    path = tmp_path / "check.json"
    check = gpu.main(["--device", "cpu", "--json", str(path)])
    assert check.failures() == []
    sections = {row["section"] for row in check.rows}
    assert {"targets", "matmul", "script", "generate f32", "generate bf16"} <= sections
    assert {f"step {name}" for name in gpu.MODELS} <= sections
    written = json.loads(path.read_text())
    assert written["rows"] == check.rows and written["skipped"] == check.skipped
    # what --device cpu leaves out, it says
    assert any("torch.compile" in s for s in check.skipped)
    assert any("torchrun" in s for s in check.skipped)
    table = capsys.readouterr().out
    assert table.startswith("GPU check on cpu")
    assert "generated / hand-written, eager" in table
    # integer data gives the held form's bits wherever every sum is exact
    targets = {r["name"]: r["value"] for r in check.rows if r["section"] == "targets"}
    assert targets["rms-mlp"] == targets["scan"] == "bit-equal"
