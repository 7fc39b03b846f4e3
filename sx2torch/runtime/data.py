"""Training batches: modded-nanogpt's token shards, memory-mapped, or a synthetic batch.

A shard is a header of 256 int32 (magic 20240520, version 1, the token count, then unused),
then the tokens as uint16. A step's global batch is B * T + 1 consecutive tokens (inputs, and
targets one token later), read in file order as modded-nanogpt reads them; rank r of K takes
rows [r B/K, (r+1) B/K) of it, so K processes see the same global batch as one.
"""

from __future__ import annotations

import array
import bisect
import glob
import os
import struct
import sys
from dataclasses import dataclass

import torch

__all__ = ["DataError", "Synthetic", "TokenShards", "write_shard"]

MAGIC = 20240520
VERSION = 1
HEADER_BYTES = 256 * 4


class DataError(Exception):
    """A problem the user can act on (the data, the command line, a run's files), reported in
    one line (exit 2)."""


@dataclass(frozen=True)
class Shard:
    path: str
    tokens: int


class TokenShards:
    def __init__(self, pattern: str, batch_size: int, seq_len: int, rank, world):
        paths = sorted(glob.glob(pattern))
        if not paths:
            raise DataError(f"--data {pattern}: no file matches")
        if batch_size % world:
            raise DataError(
                f"the batch size {batch_size} does not divide among {world} processes"
            )
        self.seq_len, self.rank = seq_len, rank
        self.per_step = batch_size * seq_len
        self.per_rank = self.per_step // world
        self.shards = [_shard(path) for path in paths]
        self.ends = []  # cumulative count of whole batches, shard by shard
        for shard in self.shards:
            done = self.ends[-1] if self.ends else 0
            self.ends.append(done + max(shard.tokens - 1, 0) // self.per_step)
        if self.ends[-1] == 0:
            raise DataError(
                f"--data {pattern}: no shard holds one batch of {batch_size} x {seq_len} "
                "tokens and one more"
            )
        self.mapped = (None, None)  # (shard, its tokens): the shard being read

    def __call__(self, step: int) -> tuple:
        """This rank's (inputs, targets) of the global batch of `step`, as int64 [rows, T]."""
        index = step % self.ends[-1]  # past the last shard, start again from the first
        at = bisect.bisect_right(self.ends, index)
        first = index - (self.ends[at - 1] if at else 0)
        start = first * self.per_step + self.rank * self.per_rank
        part = self._tokens(self.shards[at])[start : start + self.per_rank + 1]
        part = part.to(torch.int64)
        return part[:-1].view(-1, self.seq_len), part[1:].view(-1, self.seq_len)

    def _tokens(self, shard: Shard) -> torch.Tensor:
        if self.mapped[0] != shard:
            size = HEADER_BYTES + 2 * shard.tokens
            raw = torch.from_file(
                shard.path, shared=False, size=size, dtype=torch.uint8
            )
            self.mapped = (shard, raw[HEADER_BYTES:].view(torch.uint16))
        return self.mapped[1]


def _shard(path: str) -> Shard:
    if os.path.isdir(path):
        raise DataError(f"{path}: a directory, expected a token shard")
    size = os.path.getsize(path)
    if size == 0:
        raise DataError(f"{path}: the file is empty, expected a token shard")
    if size < HEADER_BYTES:
        raise DataError(
            f"{path}: truncated: {size} bytes, shorter than the {HEADER_BYTES}-byte header"
        )
    with open(path, "rb") as file:
        magic, version, tokens = struct.unpack("<3i", file.read(12))
    if magic != MAGIC:
        raise DataError(
            f"{path}: not a token shard (magic number {magic}, expected {MAGIC})"
        )
    if version != VERSION:
        raise DataError(f"{path}: unsupported shard version {version}, expected 1")
    if size % 2:  # the header is 1024 bytes and each token 2
        raise DataError(
            f"{path}: {size} bytes, an odd size: a shard's tokens after its "
            f"{HEADER_BYTES}-byte header are 2 bytes each (a truncated or foreign file?)"
        )
    held = (size - HEADER_BYTES) // 2
    if tokens < 0 or held < tokens:
        raise DataError(
            f"{path}: truncated: holds {held} tokens, its header says {tokens}"
        )
    return Shard(path, tokens)


class Synthetic:
    """One batch drawn from the seed and given at every step, so that a smoke run shows the
    loss falling as the model fits it: normal floats, or integers in [0, high) for an input
    with `high`. Rank r of K takes its rows of the first axis."""

    def __init__(self, inputs: dict, seed: int, rank: int, world: int):
        generator = torch.Generator().manual_seed(seed)
        self.batch = []
        for name, spec in inputs.items():
            shape = spec["shape"]
            if shape[0] % world:
                raise DataError(
                    f"input {name}: {shape[0]} rows do not divide among {world} processes"
                )
            if "high" in spec:
                value = torch.randint(spec["high"], shape, generator=generator)
            else:
                value = torch.randn(shape, generator=generator)
            rows = shape[0] // world
            self.batch.append(value[rank * rows : (rank + 1) * rows])

    def __call__(self, step: int) -> tuple:
        return tuple(self.batch)


def write_shard(path, tokens: torch.Tensor) -> None:
    """Write token ids (each below 65536) as a shard that TokenShards reads."""
    header = struct.pack("<3i", MAGIC, VERSION, tokens.numel()).ljust(
        HEADER_BYTES, b"\0"
    )
    body = array.array("H", tokens.flatten().tolist())
    if sys.byteorder != "little":
        body.byteswap()
    with open(path, "wb") as file:
        file.write(header + body.tobytes())
