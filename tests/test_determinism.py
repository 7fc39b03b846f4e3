"""The same source and options give the same bytes: across runs, processes and PYTHONHASHSEED."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cases import SOURCES
from sx2torch.compiler import Options, compile_source

COMPILE_ALL = """
import json, sys
from pathlib import Path
from sx2torch.compiler import Options, compile_source
out = {}
for path in sys.argv[1:]:
    text = Path(path).read_text(encoding="utf-8")
    out[path] = compile_source(text, Path(path).name, Options())
print(json.dumps(out))
"""


def compile_all(seed: str) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    paths = [str(p) for p in SOURCES]
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_ALL, *paths],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_same_bytes_for_every_hash_seed():
    """Under two hash seeds every source compiles to the bytes of the NAME.py beside it,
    which tests/test_golden.py compiles to under the suite's own seed: three seeds, with
    one compile of every source fewer than a third subprocess would take."""
    own = os.environ.get("PYTHONHASHSEED")
    seeds = [seed for seed in ("0", "1", "2") if seed != own][:2]
    expected = {str(p): p.with_suffix(".py").read_text(encoding="utf-8") for p in SOURCES}
    for seed in seeds:
        compiled = compile_all(seed)
        assert compiled.keys() == expected.keys()
        for path, code in compiled.items():
            assert code == expected[path], f"{path} under PYTHONHASHSEED={seed}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_same_bytes_twice_in_one_process(path):
    text = path.read_text(encoding="utf-8")
    first = compile_source(text, str(path), Options())
    # equal bytes, so equal text: a third compile would test nothing more
    assert compile_source(text, str(path), Options()).encode("utf-8") == first.encode(
        "utf-8"
    )


def test_the_cli_writes_the_same_bytes(tmp_path):
    source = next(p for p in SOURCES if p.name == "rms-mlp.lisp")
    outputs = []
    for seed in ("0", "1"):
        out = tmp_path / f"out{seed}.py"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run(
            [sys.executable, "-m", "sx2torch", str(source), "-o", str(out)],
            check=True,
            env=env,
        )
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
