"""The README and docs stay true: every README snippet runs, the guide's usage example trains,
the excerpts are real output, every link and anchor between the docs resolves, and nothing
they or the tests point to lies outside the repository.
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
GUIDE = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
LANGUAGE = (ROOT / "docs" / "LANGUAGE.md").read_text(encoding="utf-8")
DOCS = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "NEWS.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.M | re.S)


def blocks(text: str, language: str) -> list:
    return [body for lang, body in FENCE.findall(text) if lang == language]


def section(text: str, title: str) -> str:
    """The body of the heading `title` (any level), up to the next heading of its level or
    above; a `#` line inside a fenced block is code, not a heading."""
    lines, body, level, fenced = text.splitlines(keepends=True), [], 0, False
    for line in lines:
        heading = re.match(r"(#+) (.*)\n", line) if not fenced else None
        if line.startswith("```"):
            fenced = not fenced
        if heading and level and len(heading.group(1)) <= level:
            break
        if level:
            body.append(line)
        elif heading and heading.group(2) == title:
            level = len(heading.group(1))
    assert level, title
    return "".join(body)


def example(name: str) -> str:
    return (ROOT / "examples" / name).read_text(encoding="utf-8")


def same_words(excerpt: str, text: str) -> bool:
    """The excerpt stands in the text, its indentation aside."""
    return " ".join(excerpt.split()) in " ".join(text.split())


def test_the_readmes_snippets_are_the_ones_these_tests_run():
    """A snippet added to the README needs a test below that runs it."""
    assert [lang for lang, _ in FENCE.findall(README)] == ["sh", "lisp", "sh", "python"]


def test_the_first_commands_install_compile_and_test_leaving_no_file():
    install, test = blocks(README, "sh")[0].splitlines()
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
    assert result.stdout == example("rms-mlp.py")
    assert sorted(os.listdir(ROOT)) == before


def test_the_readmes_example_compiles_to_its_excerpt(tmp_path):
    """The source shown is the example's, the command shown compiles it (run by a shell, as
    a user types it), and the excerpt shown is what it gives."""
    (source,) = blocks(README, "lisp")
    assert source == example("rms-mlp.lisp")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "rms-mlp.lisp").write_text(source)
    command = blocks(README, "sh")[1]
    assert command.startswith("sx2torch ")
    result = subprocess.run(
        ["bash", "-c", 'sx2torch() { "$PYTHON" -m sx2torch "$@"; }\n' + command],
        cwd=tmp_path,
        env=dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stderr) == (0, "")
    generated = (tmp_path / "rms_mlp.py").read_text()
    assert generated == example("rms-mlp.py")
    (excerpt,) = blocks(README, "python")
    assert excerpt.startswith("    def ") and excerpt in generated


def test_the_usage_example_trains(tmp_path):
    usage = section(GUIDE, "Using a generated module")
    (compile_,) = blocks(usage, "sh")
    (program,) = blocks(usage, "python")
    command, source, *rest = shlex.split(compile_)
    assert command == "sx2torch"
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's sx2torch
    subprocess.run(
        [sys.executable, "-m", command, str(ROOT / source), *rest],
        cwd=tmp_path,
        env=env,
        check=True,
    )
    (tmp_path / "train.py").write_text(program)
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
    usage = section(GUIDE, "Using a generated module")
    named = re.findall(r"`([\w-]+)\.lisp` gives `(\w+)`", usage)
    assert len(named) == 2
    for source, name in named:
        assert f'__all__ = ["{name}"' in example(f"{source}.py")


def test_the_excerpts_are_real_output():
    (header,) = blocks(section(GUIDE, "check, in CI and pre-commit"), "python")
    assert header.startswith("# Generated") and example("rms-mlp.py").startswith(header)
    ports = section(GUIDE, "modded-nanogpt's GPTs")
    _, compiled = blocks(ports, "python")
    assert compiled in example("modded-nanogpt-medium.py")
    (source,) = blocks(ports, "lisp")
    assert same_words(source, example("modded-nanogpt-medium.lisp"))
    gradient = section(LANGUAGE, "gradient")
    (energy,) = blocks(gradient, "python")
    assert energy in example("energy.py")
    (source,) = blocks(gradient, "lisp")
    assert source in example("energy.lisp")


def anchors(text: str) -> set:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated one numbered."""
    found: set = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def test_links_and_anchors_resolve_inside_the_repository():
    checked = 0
    for doc in DOCS:
        text = FENCE.sub("", doc.read_text(encoding="utf-8"))
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path = (doc.parent / target).resolve() if target else doc
            assert path.is_relative_to(ROOT) and path.exists(), (doc.name, target)
            if anchor and path.suffix == ".md":
                assert anchor in anchors(path.read_text(encoding="utf-8")), (
                    doc.name,
                    f"{target}#{anchor}",
                )
            checked += 1
    assert checked > 50


def test_the_readme_is_short_and_links_every_page():
    """The README stays a two-minute read, and sends its reader to each page by audience."""
    for page in (
        "docs/guide.md",
        "docs/LANGUAGE.md",
        "docs/targets.md",
        "CONTRIBUTING.md",
        "NEWS.md",
    ):
        assert f"]({page})" in README
    assert len(README.splitlines()) <= 150


def test_nothing_reads_outside_the_repository():
    """No page or file points into the folders beside the repository, which a fresh clone
    does not have."""
    outside = re.compile(r"\.\./" + "shared|" + "/wo" + "rk/|" + '"sha' + 'red"')
    checked = [
        p
        for folder in ("sx2torch", "tests", "tools", "benchmarks", "docs", ".ci")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".md", "") and p.is_file()
    ]
    assert len(checked) > 50
    for path in [
        ROOT / "README.md",
        ROOT / "NEWS.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "pyproject.toml",
        *checked,
    ]:
        assert not outside.search(path.read_text(errors="replace")), path
