"""Runs several generated training scripts one after another in one process (or, under
torchrun, in each rank), so that one launch checks many runs without a Python start (and
torch's import) for each:

    python drive.py SCRIPT ARGS... [; SCRIPT ARGS...]...

Each run is `python SCRIPT ARGS` as a user types it, given as its own `sys.argv`; runs are
separated by a lone `;`. A run that exits with a nonzero status ends the launch with it.
Every run starts from its own state: the training loop seeds torch's generator and builds
its model, data and optimizer itself, so a run's numbers are those of a fresh process.
Under torchrun the runs share one process group, which the training loop uses and leaves
alone. Where a run shards a model with FSDP2 (`--parallel fsdp2`), each rank records in
OUT/rank-R.json (OUT its `--out`) the units and, at every save (between steps), its
parameters' bytes and the whole model's.
"""

import faulthandler
import json
import os
import runpy
import sys
from pathlib import Path

import torch.distributed as dist

from sx2torch.runtime import checkpoint, parallel

record: dict = {}


def units(model, call, mesh=None):
    record["units"] = shard(model, call, mesh)
    return record["units"]


def saving(out, step, model, *rest):
    held = whole = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        held += local.numel() * local.element_size()
        whole += p.numel() * p.element_size()
    record.setdefault("bytes", []).append({"held": held, "whole": whole})
    return save(out, step, model, *rest)


def runs(argv: list) -> list:
    """The runs' argument lists, split at each lone `;`."""
    split, run = [], []
    for arg in argv:
        if arg == ";":
            split.append(run)
            run = []
        else:
            run.append(arg)
    return split + [run]


def option(argv: list, name: str):
    return argv[argv.index(name) + 1] if name in argv else None


shard, save = parallel.fully_shard_units, checkpoint.save
parallel.fully_shard_units, checkpoint.save = units, saving
if "MASTER_ADDR" in os.environ:  # under torchrun: one process group for all the runs
    dist.init_process_group("gloo")
for argv in runs(sys.argv[1:]):
    record.clear()
    sys.argv = argv
    faulthandler.dump_traceback_later(
        300, exit=True
    )  # a hung rank shows where, and ends
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit:
        if exit.code:
            raise
    if option(argv, "--parallel") == "fsdp2":
        rank = os.environ.get("RANK", "0")
        out = Path(option(argv, "--out"))
        (out / f"rank-{rank}.json").write_text(json.dumps(record))
if (
    dist.is_initialized()
):  # gloo's threads outliving the interpreter abort the rank at exit
    dist.destroy_process_group()
