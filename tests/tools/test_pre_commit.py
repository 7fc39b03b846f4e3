"""The shipped pre-commit hook, run by pre-commit itself in a temporary git repository."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from sx2torch.compiler import Options, compile_source

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "(defparam w (normal [4 4]))\n(defun forward (x) (relu (matmul x w)))\n"


def test_the_hook_refuses_a_commit_with_a_stale_module(tmp_path):
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert (hook["id"], hook["entry"], hook["language"], hook["files"]) == (
        "sx2torch-check",
        "sx2torch check",
        "python",
        r"\.lisp$",
    )
    # Installed from the hook's repository, `language: python` would fetch sx2torch and torch
    # into an environment of pre-commit's own. Offline, the same hook runs as `unsupported`:
    # the `sx2torch` found on PATH, here this checkout run by this interpreter.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "sx2torch"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m sx2torch "$@"\n')
    shim.chmod(0o755)
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    config = {
        "repos": [{"repo": "local", "hooks": [{**hook, "language": "unsupported"}]}]
    }
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    for name in ("a", "models/b"):
        (repo / f"{name}.lisp").write_text(SOURCE)
        code = compile_source(SOURCE, f"{Path(name).name}.lisp", Options())
        (repo / f"{name}.py").write_text(code)
    (repo / "notes.py").write_text("print('not generated')\n")
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(ROOT),
        PRE_COMMIT_HOME=str(tmp_path / "cache"),
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
        GIT_CONFIG_GLOBAL=os.devnull,
    )

    def run(*argv) -> subprocess.CompletedProcess:
        return subprocess.run(  # git shows the hooks' output on stderr
            argv,
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
        )

    assert run("git", "init", "-q").returncode == 0
    installed = run(sys.executable, "-m", "pre_commit", "install")
    assert installed.returncode == 0, installed.stdout
    run("git", "add", ".")
    first = run("git", "commit", "-q", "-m", "fresh modules")
    assert first.returncode == 0, first.stdout
    assert "sx2torch check" in first.stdout and "Passed" in first.stdout

    (repo / "models" / "b.lisp").write_text(SOURCE.replace("relu", "tanh"))
    run("git", "add", ".")
    stale = run("git", "commit", "-q", "-m", "forgot to compile")
    assert stale.returncode == 1 and "Failed" in stale.stdout
    assert (
        "sx2torch check: models/b.py is stale; regenerate it: "
        "sx2torch models/b.lisp --target cuda -o models/b.py"
    ) in stale.stdout
    assert run("git", "rev-list", "--count", "HEAD").stdout == "1\n"

    regenerated = run(
        "sx2torch", "models/b.lisp", "--target", "cuda", "-o", "models/b.py"
    )
    assert regenerated.returncode == 0, regenerated.stdout
    run("git", "add", ".")
    assert run("git", "commit", "-q", "-m", "compiled").returncode == 0
    assert run("git", "rev-list", "--count", "HEAD").stdout == "2\n"


BLOCK_TORCH = """\
import runpy, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy", "tqdm"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)")

sys.meta_path.insert(0, NoTorch())
sys.argv[0] = "sx2torch"
runpy.run_module("sx2torch", run_name="__main__")
"""


def test_check_and_compile_run_with_torch_absent(tmp_path):
    """What the hook installs has no torch (it is in the `runtime` extra), and needs none."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(
        d.startswith(("torch", "numpy", "tqdm")) for d in project["dependencies"]
    )
    assert project["optional-dependencies"]["runtime"][0].startswith("torch")
    (tmp_path / "no_torch.py").write_text(BLOCK_TORCH)
    for name in ("tiny-gpt", "rms-mlp"):
        for suffix in (".lisp", ".py"):
            (tmp_path / f"{name}{suffix}").write_bytes(
                (ROOT / "examples" / f"{name}{suffix}").read_bytes()
            )

    def sx2torch(*argv) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "no_torch.py", *argv],
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            timeout=300,
        )

    blocked = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH.split("sys.argv")[0] + "import torch"],
        capture_output=True,
        text=True,
    )
    assert "(blocked)" in blocked.stderr
    assert sx2torch("check", ".").returncode == 0
    (tmp_path / "rms-mlp.py").write_text("stale\n")
    stale = sx2torch("check", "rms-mlp.lisp")
    assert stale.returncode == 1 and "rms-mlp.py is stale" in stale.stderr
    compiled = sx2torch("rms-mlp.lisp", "-o", "rms-mlp.py")
    assert compiled.returncode == 0, compiled.stderr
    assert (tmp_path / "rms-mlp.py").read_bytes() == (
        ROOT / "examples" / "rms-mlp.py"
    ).read_bytes()
