"""Runs a generated training script as `python SCRIPT ARGS...` runs it and, once rank 0 has
written step N's metrics, kills rank 0 (SIGKILL; torchrun then ends the other ranks), so
that no rank saves or exits cleanly:

    python kill.py N SCRIPT ARGS...

Rank 0 writes step N's metrics after every rank has finished step N, so the checkpoints
saved before it are whole, whatever the machine's load.
"""

import os
import runpy
import signal
import sys

from sx2torch.runtime.metrics import Metrics

after, script = int(sys.argv[1]), sys.argv[2]
write = Metrics.write


def write_then_kill(self, record):
    write(self, record)
    if record["step"] == after:
        os.kill(os.getpid(), signal.SIGKILL)


Metrics.write = write_then_kill
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
