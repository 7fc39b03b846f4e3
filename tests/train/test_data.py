"""Token shards and synthetic batches: what each step and each rank reads, and the errors."""

from __future__ import annotations

import struct
import sys

import pytest
import torch

from sx2torch.runtime.data import (
    DataError,
    NamedTensors,
    Synthetic,
    TokenShards,
    write_shard,
)


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


def examples(count: int, first: int = 0) -> dict:
    """Named tensors whose rows say which example they are: `image` row i is filled with
    i, `label` row i is i."""
    ids = torch.arange(first, first + count)
    return {"image": ids[:, None, None].expand(count, 2, 3).float(), "label": ids}


def drawn(data: NamedTensors, steps) -> list:
    batches = [data(step) for step in steps]
    for image, label in batches:  # each row of image is the example its label names
        assert image.shape[1:] == (2, 3) and image.dtype == torch.float32
        assert torch.equal(image[:, 0, 0].long(), label)
    return [label.tolist() for _, label in batches]


def test_named_tensors_draw_every_row_once_an_epoch_in_a_seeded_order(tmp_path):
    torch.save(examples(7), tmp_path / "a.pt")
    torch.save(examples(5, first=7), tmp_path / "b.pt")
    pattern, names = str(tmp_path / "*.pt"), ["image", "label"]
    data = NamedTensors(pattern, names, 4, seed=3, rank=0, world=1)
    # 12 rows: 3 batches of 4 an epoch, each epoch a new order of all 12
    epochs = [drawn(data, range(e * 3, e * 3 + 3)) for e in range(3)]
    for epoch in epochs:
        assert sorted(sum(epoch, [])) == list(range(12))
    assert epochs[0] != epochs[1] != epochs[2]
    # a step's batch depends on the seed and the step alone: a resumed run reads the same
    again = NamedTensors(pattern, names, 4, seed=3, rank=0, world=1)
    assert drawn(again, [7, 2]) == [epochs[2][1], epochs[0][2]]
    other = NamedTensors(pattern, names, 4, seed=4, rank=0, world=1)
    assert drawn(other, range(3)) != epochs[0]


def test_named_tensors_skip_an_epochs_remainder_and_split_by_rank(tmp_path):
    torch.save(examples(10), tmp_path / "a.pt")
    pattern, names = str(tmp_path / "a.pt"), ["image", "label"]
    whole = NamedTensors(pattern, names, 4, seed=0, rank=0, world=1)
    epoch = drawn(whole, range(2))  # 10 rows: 2 batches, 2 rows left out
    assert len(set(sum(epoch, []))) == 8
    parts = [NamedTensors(pattern, names, 4, seed=0, rank=r, world=2) for r in range(2)]
    for step in (0, 1, 5):
        for side in (0, 1):
            joined = torch.cat([part(step)[side] for part in parts])
            assert torch.equal(joined, whole(step)[side])


def test_safetensors_files_give_the_same_batches(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    torch.save(examples(6), tmp_path / "a.pt")
    safetensors.save_file(examples(6), tmp_path / "a.safetensors")
    names = ["image", "label"]
    pt = NamedTensors(str(tmp_path / "a.pt"), names, 3, seed=1, rank=0, world=1)
    st = NamedTensors(str(tmp_path / "a.safetensors"), names, 3, 1, rank=0, world=1)
    assert drawn(pt, range(4)) == drawn(st, range(4))


def test_safetensors_without_the_package_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "a.safetensors").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(DataError) as caught:
        NamedTensors(str(tmp_path / "a.safetensors"), ["x"], 1, 0, rank=0, world=1)
    assert str(caught.value) == (
        f"{tmp_path}/a.safetensors: reading .safetensors needs the safetensors package "
        "(pip install safetensors), or save the tensors with torch.save as .pt"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"image": torch.zeros(4, 2, 3)}, "its tensors are named image; the loss takes image, label"),
        ({"image": torch.zeros(4, 2, 3), "label": torch.zeros(4), "id": torch.zeros(4)}, "its tensors are named id, image, label; the loss takes image, label"),
        ({"image": torch.zeros(4, 2, 3), "label": torch.zeros(3)}, "label has 3 rows, image has 4: each tensor holds one row per example"),
        ({"image": torch.zeros(4, 2, 3), "label": torch.tensor(1.0)}, "label is a scalar: each tensor holds one row per example"),
        ([torch.zeros(4)], "holds a list, expected a dict of tensors named image, label"),
        ({"image": torch.zeros(4, 2, 3), "label": [1, 2]}, "holds a list as label, expected a tensor"),
    ],
)  # fmt: skip
def test_bad_named_tensors(tmp_path, content, message):
    path = tmp_path / "bad.pt"
    torch.save(content, path)
    with pytest.raises(DataError) as caught:
        NamedTensors(str(path), ["image", "label"], 1, 0, rank=0, world=1)
    assert str(caught.value) == f"{path}: {message}"


def test_named_tensor_files_must_agree_and_hold_a_batch(tmp_path):
    torch.save(examples(3), tmp_path / "a.pt")
    torch.save(
        examples(3) | {"label": torch.zeros(3, dtype=torch.int32)}, tmp_path / "b.pt"
    )
    torch.save(examples(3) | {"image": torch.zeros(3, 3, 2)}, tmp_path / "c.pt")
    (tmp_path / "d.pt").write_bytes(b"not a tensor file")
    names = ["image", "label"]

    def refused(pattern: str, batch_size: int = 2) -> str:
        with pytest.raises(DataError) as caught:
            NamedTensors(str(tmp_path / pattern), names, batch_size, 0, 0, 1)
        return str(caught.value)

    assert refused("[ab].pt") == (
        f"{tmp_path}/b.pt: label is torch.int32 [] per row, {tmp_path}/a.pt's is "
        "torch.int64 []: every file holds the same kind of rows"
    )
    assert refused("[ac].pt").startswith(
        f"{tmp_path}/c.pt: image is torch.float32 [3, 2]"
    )
    assert refused("d.pt").startswith(f"{tmp_path}/d.pt: not a file torch.load reads (")
    assert refused("a.pt", batch_size=4) == (
        f"--data {tmp_path}/a.pt: 3 rows in all, fewer than one batch of 4"
    )
    with pytest.raises(DataError, match="^the batch size 3 does not divide among 2 "):
        NamedTensors(str(tmp_path / "a.pt"), names, 3, 0, rank=0, world=2)
