"""A generated module's run-time error names its source form: FILE.lisp:LINE:COL, the line, a
caret, after the Python traceback; nothing in the generated file, nothing on the call path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sx2torch
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import located

ROOT = Path(__file__).resolve().parents[2]
# a's width is a constructor argument, so the rank check cannot refuse the chain: the error
# is one the module raises when it runs
SHAPE = """\
(defconst d 8)
(defparam a (normal [4 d]))
(defparam b (normal [16 2]))
(defun forward (x)
  (matmul (matmul x a) b))
"""
NOTE = (
    "shape.lisp:5:3: note: the error is raised in this form (shape.py, line 18)\n"
    "    (matmul (matmul x a) b))\n"
    "    ^"
)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "shape.lisp").write_text(SHAPE)
    (tmp_path / "shape.py").write_text(compile_source(SHAPE, "shape.lisp", Options()))
    (tmp_path / "use.py").write_text(
        "import torch\nfrom shape import Shape\nShape()(torch.randn(3, 4))\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_script(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "use.py"],
        cwd=folder,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(folder)])),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_uncaught_error_shows_the_source_form_after_the_traceback(folder):
    done = run_script(folder)
    assert done.returncode == 1
    assert done.stderr.endswith(
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (3x8 and 16x2)\n"
        f"{folder / 'shape.lisp'}:5:3: note: the error is raised in this form (shape.py, line 18)\n"
        "    (matmul (matmul x a) b))\n"
        "    ^\n"
    )
    assert (
        '  File "' + str(folder / "shape.py") + '", line 18, in forward' in done.stderr
    )


def test_a_stale_module_is_not_mapped(folder):
    (folder / "shape.lisp").write_text(
        SHAPE.replace("(matmul (matmul x a) b)", "(matmul (tanh (matmul x a)) b)")
    )
    done = run_script(folder)
    assert done.returncode == 1 and done.stderr.endswith("(3x8 and 16x2)\n")


def test_locate_maps_each_generated_frame(folder):
    sys.path.insert(0, str(folder))
    try:
        from shape import Shape
    finally:
        sys.path.remove(str(folder))
    with pytest.raises(RuntimeError) as caught:
        Shape()(torch.randn(3, 4))
    (note,) = located.locate(caught.value)
    assert note == f"{folder}/{NOTE}"


def test_a_loaded_module_maps_to_its_source_anywhere(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "shape.lisp"
    path.write_text(SHAPE)
    monkeypatch.chdir(tmp_path)
    module = sx2torch.load(path)
    with pytest.raises(RuntimeError) as caught:
        module.Shape()(torch.randn(3, 4))
    (note,) = located.locate(caught.value)
    assert note.splitlines()[0].startswith(f"{path}:5:3: note: the error is raised")


def test_the_generated_file_is_unchanged():
    assert (
        "lisp:" not in compile_source(SHAPE, "shape.lisp", Options()).split("\n", 2)[2]
    )


def test_importing_the_runtime_installs_one_hook():
    # a fresh interpreter: any test may have wrapped this process's hook
    # (init_process_group does)
    check = (
        "import sys, sx2torch.runtime\n"
        "from sx2torch.runtime import located\n"
        "located.install()\n"
        "print(sys.excepthook is located._excepthook)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout == "True\n", done.stderr
