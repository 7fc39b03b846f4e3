"""Runs a generated training script as `python SCRIPT ARGS...` runs it, and sends the
process SIGINT (a terminal's Ctrl-C) once the script has written N steps' metrics:

    python interrupt.py N SCRIPT ARGS...

The signal arrives after step N - 1 whatever the machine's load, so a test waits on no
clock: the loop finishes the step it is in (step N) and saves N + 1 steps.
"""

import os
import runpy
import signal
import sys

from sx2torch.runtime.metrics import Metrics

after, script = int(sys.argv[1]), sys.argv[2]
write = Metrics.write


def write_then_interrupt(self, record):
    write(self, record)
    if record["step"] == after - 1:
        os.kill(os.getpid(), signal.SIGINT)


Metrics.write = write_then_interrupt
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
