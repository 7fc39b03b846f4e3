"""Token shards and synthetic batches: what each step and each rank reads, and the errors."""

from __future__ import annotations

import struct

import pytest
import torch

from sx2torch.runtime.data import DataError, Synthetic, TokenShards, write_shard


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(65536, (n,), generator=torch.Generator().manual_seed(seed))


def test_write_shard_layout(tmp_path):
    ids = torch.tensor([0, 1, 513, 65535])
    write_shard(tmp_path / "a.bin", ids)
    raw = (tmp_path / "a.bin").read_bytes()
    assert len(raw) == 1024 + 8
    assert struct.unpack("<256i", raw[:1024]) == (20240520, 1, 4) + (0,) * 253
    assert struct.unpack("<4H", raw[1024:]) == (0, 1, 513, 65535)


def test_each_step_reads_the_next_tokens_across_shards_and_wraps(tmp_path):
    first, second = tokens(1000, 1), tokens(300, 2)
    write_shard(tmp_path / "s_000.bin", first)
    write_shard(tmp_path / "s_001.bin", second)
    data = TokenShards(str(tmp_path / "s_*.bin"), 4, 16, rank=0, world=1)
    # 999 // 64 = 15 batches in the first shard, 299 // 64 = 4 in the second
    expected = [first[i * 64 : i * 64 + 65] for i in range(15)]
    expected += [second[i * 64 : i * 64 + 65] for i in range(4)]
    for step in range(2 * len(expected)):
        inputs, targets = data(step)
        chunk = expected[step % len(expected)]
        assert inputs.dtype == targets.dtype == torch.int64
        assert torch.equal(inputs, chunk[:-1].view(4, 16))
        assert torch.equal(targets, chunk[1:].view(4, 16))


def test_ranks_split_the_global_batch(tmp_path):
    write_shard(tmp_path / "s.bin", tokens(5000))
    pattern = str(tmp_path / "s.bin")
    whole = TokenShards(pattern, 8, 32, rank=0, world=1)
    parts = [TokenShards(pattern, 8, 32, rank=r, world=4) for r in range(4)]
    for step in (0, 3, 17):
        for side in (0, 1):
            joined = torch.cat([part(step)[side] for part in parts])
            assert torch.equal(joined, whole(step)[side])


def test_synthetic_batch_is_drawn_once_and_split_by_rank():
    spec = {"x": {"shape": (6, 3)}, "y": {"shape": (6,), "high": 5}}
    whole = Synthetic(spec, seed=1, rank=0, world=1)
    x, y = whole(0)
    generator = torch.Generator().manual_seed(1)
    assert torch.equal(x, torch.randn(6, 3, generator=generator))
    assert torch.equal(y, torch.randint(5, (6,), generator=generator))
    assert all(torch.equal(a, b) for a, b in zip(whole(7), (x, y)))
    parts = [Synthetic(spec, seed=1, rank=r, world=3)(2) for r in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert torch.equal(torch.cat([p[1] for p in parts]), y)


def header(magic=20240520, version=1, count=10) -> bytes:
    return struct.pack("<3i", magic, version, count).ljust(1024, b"\0")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "the file is empty, expected a token shard"),
        (header()[:100], "truncated: 100 bytes, shorter than the 1024-byte header"),
        (header() + b"\0" * 12, "truncated: holds 6 tokens, its header says 10"),
        (header(magic=1234) + b"\0" * 20, "not a token shard (magic number 1234, expected 20240520)"),
        (header(version=2) + b"\0" * 20, "unsupported shard version 2, expected 1"),
        (header() + b"\0" * 21, "1045 bytes, an odd size: a shard's tokens after its 1024-byte header are 2 bytes each (a truncated or foreign file?)"),
    ],
)  # fmt: skip
def test_bad_shards(tmp_path, content, message):
    path = tmp_path / "bad.bin"
    path.write_bytes(content)
    with pytest.raises(DataError) as caught:
        TokenShards(str(path), 1, 4, rank=0, world=1)
    assert str(caught.value) == f"{path}: {message}"


def test_too_little_data(tmp_path):
    write_shard(tmp_path / "s.bin", tokens(64))
    pattern = str(tmp_path / "*.bin")
    with pytest.raises(DataError, match="no shard holds one batch of 4 x 16 tokens"):
        TokenShards(pattern, 4, 16, rank=0, world=1)
    with pytest.raises(DataError, match="^--data .*nothing.*: no file matches$"):
        TokenShards(str(tmp_path / "nothing*"), 4, 16, rank=0, world=1)
    with pytest.raises(
        DataError, match="batch size 4 does not divide among 3 processes"
    ):
        TokenShards(pattern, 4, 4, rank=0, world=3)
