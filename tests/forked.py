"""`python COMMAND` in a process forked from one that has imported torch already, so that the
tests that train in processes pay for one Python start, not one per run: a fresh process
spends about 4 CPU seconds before its first step (`import torch`, 1.4 s, and torch.optim's
import of `torch._dynamo` at the first optimizer built, 2 s).

One server per test process (this file run as a script, started at the first run) imports
PRELOAD and forks a child for each run; nothing one run does reaches the next. The child
takes the command's working directory and environment (torch's threads set from
OMP_NUM_THREADS, as a fresh process reads it), a session of its own, and runs the script, or
`-m MODULE`, as `__main__` with its own `sys.argv`, as `python COMMAND` runs it, and ends as
Python ends. It starts with PRELOAD imported, so it serves the scripts that import the
training loop anyway (generated training scripts and the tests' wrappers of them), whose
runs are then a fresh process's. Under `-m torch.distributed.run`, FORKED_RANKS has torchrun
fork its ranks from it in turn (torchrun's own `--run-path --start-method=fork`: each rank
runs the script with runpy).
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

import torch

PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.distributed.run",
    "torch.distributed.checkpoint",
    "sx2torch.runtime.train",
]
FORKED_RANKS = ["--run-path", "--start-method=fork"]
ROOT = Path(__file__).resolve().parents[1]


def python(work: Path, *command: str, env: dict) -> tuple[int, str]:
    """(exit status, stderr) of `python COMMAND` run in `work` with `env`, its stdout
    dropped. It waits without a timeout (a loaded machine takes what it takes); where the
    wait is cut short (the test stopped), the run's whole session is killed, so that no
    process of it is left behind."""
    server = _server()
    with tempfile.NamedTemporaryFile("r", suffix=".stderr") as stderr:
        request = [str(work), dict(env), list(command), stderr.name]
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        pid = int(server.stdout.readline())
        try:
            code = int(server.stdout.readline())
        except BaseException:
            os.killpg(pid, signal.SIGKILL)
            raise
        return code, stderr.read()


@functools.cache
def _server() -> subprocess.Popen:
    server = subprocess.Popen(
        [sys.executable, __file__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),  # this checkout's sx2torch
    )
    atexit.register(_stop, server)
    return server


def _stop(server: subprocess.Popen) -> None:
    server.stdin.close()
    server.wait()


def _serve() -> None:
    """Forks a child for each request, a line of JSON; answers its pid, then its status."""
    for module in PRELOAD:
        importlib.import_module(module)
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                status = _child(*json.loads(line))
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)  # never back into the server's loop
        print(pid, flush=True)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)


def _child(work: str, env: dict, command: list, stderr: str) -> int:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # not the server's requests
    os.dup2(null, 1)
    os.dup2(os.open(stderr, os.O_WRONLY), 2)
    os.chdir(work)
    os.environ.clear()
    os.environ.update(env)
    if "OMP_NUM_THREADS" in env:
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    return _exit_status(command)


def _exit_status(command: list) -> int:
    """Runs the command as Python runs it, and ends as Python's exit does (an uncaught
    exception shown by sys.excepthook, the threads that are not daemons joined, atexit's
    functions run): its exit status."""
    try:
        if command[0] == "-m":
            sys.argv = command[1:]
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = command
            runpy.run_path(command[0], run_name="__main__")
        status = 0
    except SystemExit as exit:
        status = _status(exit.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return status


def _status(code) -> int:
    """sys.exit's argument as Python's exit status: None 0, a number itself, else printed
    and 1."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _serve()
