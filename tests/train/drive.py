"""Runs several generated training scripts one after another in one process (or, under
torchrun, in each rank), so that one launch checks many models:

    python drive.py OUT SCRIPT[:PARALLEL] ... -- ARGS...

Under torchrun the runs share one process group, which the training loop uses and leaves
alone. Each script runs as `python SCRIPT --out OUT/NAME[-PARALLEL] [--parallel PARALLEL] ARGS`.
Where FSDP2 shards a model, each rank records in OUT/NAME-fsdp2/rank-R.json the units and,
at every save (between steps), its parameters' bytes and the whole model's.
"""

import faulthandler
import json
import os
import runpy
import sys
from pathlib import Path

import torch.distributed as dist

from sx2torch.runtime import checkpoint, parallel

out, rest = Path(sys.argv[1]), sys.argv[2:]
split = rest.index("--")
runs, args = rest[:split], rest[split + 1 :]
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


shard, save = parallel.fully_shard_units, checkpoint.save
parallel.fully_shard_units, checkpoint.save = units, saving
if "MASTER_ADDR" in os.environ:  # under torchrun: one process group for all the runs
    dist.init_process_group("gloo")
for run in runs:
    script, _, mode = run.partition(":")
    name = Path(script).stem + (f"-{mode}" if mode else "")
    record.clear()
    sys.argv = [script, "--out", str(out / name), *args]
    sys.argv += ["--parallel", mode] if mode else []
    faulthandler.dump_traceback_later(
        300, exit=True
    )  # a hung rank shows where, and ends
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        if exit.code:
            raise
    if mode == "fsdp2":
        rank = os.environ.get("RANK", "0")
        (out / name / f"rank-{rank}.json").write_text(json.dumps(record))
if dist.is_initialized():  # gloo's threads outliving the interpreter abort the rank at exit
    dist.destroy_process_group()
