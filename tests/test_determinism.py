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
from sx2torch.compiler import Options, compile_source
out = {}
for path in sys.argv[1:]:
    out[path] = compile_source(open(path, encoding="utf-8").read(), path, Options())
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
    first, *others = [compile_all(seed) for seed in ("0", "1", "2")]
    assert len(first) == len(SOURCES)
    for other in others:
        assert other == first


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_same_bytes_twice_in_one_process(path):
    text = path.read_text(encoding="utf-8")
    first = compile_source(text, str(path), Options())
    assert compile_source(text, str(path), Options()) == first
    assert first.encode("utf-8") == compile_source(text, str(path), Options()).encode(
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
