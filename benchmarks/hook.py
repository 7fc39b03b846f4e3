"""The pre-commit hook's first run: time, and the size of the environment pre-commit makes.

Clones this checkout's HEAD (commit first) into a temporary folder, makes a repository that
uses its `sx2torch-check` hook on two bundled examples, and runs `pre-commit run --all-files`
with an empty PRE_COMMIT_HOME, which installs the hook's environment as a user's first run
does. Run: ``python -m benchmarks.hook`` (pre-commit installed; pip as configured here).
"""

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("rms-mlp", "tiny-gpt")


def size_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        hook, user, home = scratch / "sx2torch", scratch / "user", scratch / "home"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(hook)], check=True)
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        user.mkdir()
        for name in EXAMPLES:
            for suffix in (".lisp", ".py"):
                shutil.copy(ROOT / "examples" / f"{name}{suffix}", user)
        (user / ".pre-commit-config.yaml").write_text(
            f"repos:\n  - repo: {hook}\n    rev: {rev}\n"
            "    hooks:\n      - id: sx2torch-check\n"
        )
        subprocess.run(["git", "init", "-q"], cwd=user, check=True)
        subprocess.run(["git", "add", "."], cwd=user, check=True)
        env = dict(os.environ, PRE_COMMIT_HOME=str(home))
        env.pop("PYTHONPATH", None)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "pre_commit", "run", "--all-files"],
            cwd=user,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(done.stdout.strip().splitlines()[-1])
        print(
            f"first run: {wall:.1f} s wall, {cpu:.1f} s CPU (load average {os.getloadavg()[0]:.1f})"
        )
        print(
            f"environment: {size_mb(home):.0f} MB ({home.name}, all of PRE_COMMIT_HOME)"
        )
        sys.exit(done.returncode)


if __name__ == "__main__":
    main()
