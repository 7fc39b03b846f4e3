"""Training batches: modded-nanogpt's token shards, memory-mapped; named tensors; or a
synthetic batch.

A shard is a header of 256 int32 (magic 20240520, version 1, the token count, then unused),
then the tokens as uint16. A step's global batch is B * T + 1 consecutive tokens (inputs, and
targets one token later), read in file order as modded-nanogpt reads them; rank r of K takes
rows [r B/K, (r+1) B/K) of it, so K processes see the same global batch as one.

Named tensors are `.pt` or `.safetensors` files of one tensor per argument of the loss, each
with one row per example along its first axis; a step's global batch is B rows of them.
"""

from __future__ import annotations

import array
import bisect
import glob
import hashlib
import os
import struct
import sys
import zipfile
from dataclasses import dataclass

import torch

__all__ = [
    "DataError",
    "NamedTensors",
    "Synthetic",
    "TokenShards",
    "holds_named_tensors",
    "write_shard",
]

MAGIC = 20240520
VERSION = 1
HEADER_BYTES = 256 * 4
NAMED = (".pt", ".safetensors")


class DataError(Exception):
    """A problem the user can act on (the data, the command line, a run's files), reported in
    one line (exit 2)."""


@dataclass(frozen=True)
class Shard:
    path: str
    tokens: int


class TokenShards:
    out_of_range = "a token id of --data beyond the model's vocabulary?"

    def __init__(self, pattern: str, batch_size: int, seq_len: int, rank, world):
        paths = _matching(pattern)
        _divides(batch_size, world)
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


def _matching(pattern: str) -> list:
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise DataError(f"--data {pattern}: no file matches")
    return paths


def _divides(batch_size: int, world: int) -> None:
    if batch_size % world:
        raise DataError(
            f"the batch size {batch_size} does not divide among {world} processes"
        )


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


def holds_named_tensors(pattern: str) -> bool:
    """Whether the files `pattern` matches are named tensors (`.pt`, `.safetensors`) rather
    than token shards; a mix of the two is refused."""
    paths = _matching(pattern)
    named = [p for p in paths if p.endswith(NAMED)]
    other = [p for p in paths if not p.endswith(NAMED)]
    if named and other:
        raise DataError(
            f"--data {pattern}: {other[0]} is not a .pt or .safetensors file like "
            f"{named[0]}: give files of one kind"
        )
    return bool(named)


class NamedTensors:
    """Batches of B rows of named tensors, one tensor per argument of the loss.

    The files' rows, in sorted file order, are one data set. Each epoch draws all of them in
    an order seeded by the seed and the epoch, B rows a step (the last N mod B are left out
    of that epoch), so a step's batch depends on the seed and the step alone and a resumed
    run reads what an uninterrupted one reads. Rank r of K takes rows [r B/K, (r+1) B/K) of
    the global batch. `.pt` files are memory-mapped; `.safetensors` files are read whole.
    """

    out_of_range = "a value of --data beyond the model's sizes?"

    def __init__(self, pattern, names, batch_size, seed, rank, world):
        paths = _matching(pattern)
        _divides(batch_size, world)
        self.names, self.seed, self.batch_size = names, seed, batch_size
        self.per_rank = batch_size // world
        self.first = self.per_rank * rank  # this rank's first row of a global batch
        self.files = [_named_tensors(path, names) for path in paths]
        for path, tensors in zip(paths[1:], self.files[1:]):
            _same_rows(path, tensors, paths[0], self.files[0])
        rows = [len(tensors[names[0]]) for tensors in self.files]
        self.ends = torch.tensor(rows).cumsum(0)  # each file's end among all the rows
        self.starts = self.ends - torch.tensor(rows)
        total = int(self.ends[-1])
        if total < batch_size:
            raise DataError(
                f"--data {pattern}: {total} rows in all, fewer than one batch of "
                f"{batch_size}"
            )
        self.per_epoch = total // batch_size
        self.order = (None, None)  # (epoch, its order of the rows)

    def __call__(self, step: int) -> tuple:
        """This rank's rows of the global batch of `step`, one tensor per name."""
        epoch, index = divmod(step, self.per_epoch)
        start = index * self.batch_size + self.first
        rows = self._order(epoch)[start : start + self.per_rank]
        which = torch.bucketize(rows, self.ends, right=True)  # the file of each row
        # (file, the batch's rows from it, their rows in that file)
        picks = [
            (f, which == f, rows[which == f] - self.starts[f])
            for f in which.unique().tolist()
        ]
        batch = []
        for name in self.names:
            like = self.files[0][name]
            part = torch.empty((len(rows), *like.shape[1:]), dtype=like.dtype)
            for f, chosen, inside in picks:
                part[chosen] = self.files[f][name][inside]
            batch.append(part)
        return tuple(batch)

    def _order(self, epoch: int) -> torch.Tensor:
        if self.order[0] != epoch:
            # a seed of its own for each epoch, so that no epoch needs the ones before it
            digest = hashlib.sha256(f"{self.seed} {epoch}".encode()).digest()
            generator = torch.Generator().manual_seed(
                int.from_bytes(digest[:8], "little")
            )
            self.order = (
                epoch,
                torch.randperm(int(self.ends[-1]), generator=generator),
            )
        return self.order[1]


def _named_tensors(path: str, names: list) -> dict:
    """The tensors of one file, checked: exactly the loss's arguments, one row per example."""
    tensors = _read(path)
    if not isinstance(tensors, dict):
        raise DataError(
            f"{path}: holds a {type(tensors).__name__}, expected a dict of tensors named "
            + ", ".join(names)
        )
    if sorted(tensors) != sorted(names):
        raise DataError(
            f"{path}: its tensors are named {', '.join(sorted(map(str, tensors)))}; "
            f"the loss takes {', '.join(names)}"
        )
    for name in names:
        if not isinstance(tensors[name], torch.Tensor):
            raise DataError(
                f"{path}: holds a {type(tensors[name]).__name__} as {name}, "
                "expected a tensor"
            )
        if tensors[name].ndim == 0:
            raise DataError(
                f"{path}: {name} is a scalar: each tensor holds one row per example"
            )
        rows, first = len(tensors[name]), len(tensors[names[0]])
        if rows != first:
            raise DataError(
                f"{path}: {name} has {rows} rows, {names[0]} has {first}: each tensor "
                "holds one row per example"
            )
    return tensors


def _same_rows(path: str, tensors: dict, first_path: str, first: dict) -> None:
    """Every file's rows have the first file's shapes and dtypes: a batch mixes files."""
    for name, tensor in tensors.items():
        ours = f"{tensor.dtype} {list(tensor.shape[1:])}"
        theirs = f"{first[name].dtype} {list(first[name].shape[1:])}"
        if ours != theirs:
            raise DataError(
                f"{path}: {name} is {ours} per row, {first_path}'s is {theirs}: every "
                "file holds the same kind of rows"
            )


def _read(path: str):
    if os.path.isdir(path):
        raise DataError(f"{path}: a directory, expected a file of named tensors")
    if path.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError:  # an optional package: only these files need it
            raise DataError(
                f"{path}: reading .safetensors needs the safetensors package "
                "(pip install safetensors), or save the tensors with torch.save as .pt"
            ) from None
        read, kind = load_file, "safetensors"
    else:
        # weights_only: a .pt file runs no code of its own; mmap (torch.save's zip format,
        # not the legacy one): its rows stay on disk until a batch reads them
        mmap = zipfile.is_zipfile(path)
        read, kind = (
            lambda p: torch.load(p, map_location="cpu", weights_only=True, mmap=mmap),
            "torch.load",
        )
    try:
        return read(path)
    except (
        Exception
    ) as error:  # whatever the reader raises, the file is not one it reads
        first = next(iter(str(error).splitlines()), "")  # torch's messages run on
        raise DataError(
            f"{path}: not a file {kind} reads ({type(error).__name__}: {first})"
        ) from None


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
