"""The README and docs stay true: their commands run, their usage example trains, their
excerpts are real output, and nothing they or the tests point to lies outside the repository.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def blocks(language: str) -> list:
    return re.findall(rf"^```{language}\n(.*?)^```$", README, flags=re.M | re.S)


def section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_first_commands_install_compile_and_test_leaving_no_file():
    install, test = blocks("sh")[0].splitlines()
    assert test == "python -m pytest -q -n auto --dist loadfile"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test in ci, "CI runs the README's test command"
    *pip, compile_ = install.split(" && ")
    assert pip == ["pip install torch==2.13.0", 'pip install -e ".[test]"']
    command, *args = shlex.split(compile_)
    before = sorted(os.listdir(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", command, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (ROOT / "examples" / "rms-mlp.py").read_text()
    assert sorted(os.listdir(ROOT)) == before


def test_the_usage_example_trains(tmp_path):
    usage = section("Using a generated module")
    (compile_,) = re.findall(r"^```sh\n(.*?)\n```$", usage, flags=re.M | re.S)
    (example,) = re.findall(r"^```python\n(.*?)^```$", usage, flags=re.M | re.S)
    command, source, *rest = shlex.split(compile_)
    assert command == "sx2torch"
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's sx2torch
    subprocess.run(
        [sys.executable, "-m", command, str(ROOT / source), *rest],
        cwd=tmp_path,
        env=env,
        check=True,
    )
    (tmp_path / "train.py").write_text(example)
    result = subprocess.run(
        [sys.executable, "-W", "error", "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert (result.returncode, result.stderr) == (0, "")
    losses = [float(line.split()[1]) for line in result.stdout.splitlines()]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2]


def test_the_class_names_it_gives_are_the_real_ones():
    usage = section("Using a generated module")
    for source, name in re.findall(r"`([\w-]+)\.lisp` gives `(\w+)`", usage):
        code = (ROOT / "examples" / f"{source}.py").read_text()
        assert f'__all__ = ["{name}"' in code


def test_the_excerpts_are_real_output():
    header, *_ = [b for b in blocks("python") if b.startswith("# Generated")]
    assert (ROOT / "examples" / "rms-mlp.py").read_text().startswith(header)
    rms_mlp, energy, medium = [b for b in blocks("python") if b.startswith("    ")]
    assert rms_mlp in (ROOT / "examples" / "rms-mlp.py").read_text()
    assert energy in (ROOT / "examples" / "energy.py").read_text()
    assert medium in (ROOT / "examples" / "modded-nanogpt-medium.py").read_text()


def test_links_stay_inside_the_repository():
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), (doc.name, target)


def test_nothing_reads_outside_the_repository():
    outside = re.compile(r"\.\./" + "shared|" + "/wo" + "rk/|" + '"sha' + 'red"')
    checked = [
        p
        for folder in ("sx2torch", "tests", "tools", "benchmarks", "docs", ".ci")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".md", "") and p.is_file()
    ]
    assert len(checked) > 50
    for path in [ROOT / "README.md", ROOT / "pyproject.toml", *checked]:
        assert not outside.search(path.read_text(errors="replace")), path
