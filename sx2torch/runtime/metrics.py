"""`DIR/metrics.jsonl`: one JSON object a line, strict JSON, never a torn line.

A non-finite loss is written as `"loss": null` with `"nonfinite": "nan"` (or "inf", "-inf"),
since JSON has no NaN. Each line is written whole or not at all: a write that fails partway
(a full disk) is cut back to the line before it. A resumed run keeps the lines of the steps
before its checkpoint; a torn last line (a crash outside this writer) is dropped with a
warning.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from sx2torch.runtime.data import DataError

__all__ = ["Metrics", "finite_or_null"]


def finite_or_null(record: dict, key: str, value: float) -> dict:
    if math.isfinite(value):
        return record | {key: value}
    return record | {key: None, "nonfinite": str(value)}


class Metrics:
    def __init__(self, path: Path, start: int, warn):
        self.path = path
        kept = _records_before(path, start, warn) if start and path.exists() else []
        part = path.with_name(path.name + ".tmp")
        part.write_text("".join(line + "\n" for line in kept))
        part.replace(path)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.size = os.fstat(self.fd).st_size

    def write(self, record: dict) -> None:
        data = (json.dumps(record, allow_nan=False) + "\n").encode()
        try:
            written = 0
            while written < len(data):
                written += os.write(self.fd, data[written:])
        except OSError as error:
            os.ftruncate(self.fd, self.size)
            raise DataError(
                f"{self.path}: {error.strerror or error} writing step {record['step']}; "
                "the file ends with the step before it"
            ) from None
        self.size += len(data)

    def close(self) -> None:
        os.close(self.fd)


def _records_before(path: Path, start: int, warn) -> list:
    lines = path.read_text().splitlines()
    kept = []
    for number, line in enumerate(lines, 1):
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            if number == len(lines):
                warn(f"{path}:{number}: a torn last line, dropped")
                break
            raise DataError(f"{path}:{number}: not a metrics record") from None
        if step < start:
            kept.append(line)
    return kept
