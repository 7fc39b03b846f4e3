"""Sweep all 2^32 float32 bit patterns through the integer form of ``round_to_bf16``.

Compares each result bitwise with torch's own cast, ``x.to(torch.bfloat16)``
(two NaNs count as equal, payloads aside), and prints the mismatch count and
the elapsed seconds. Run: ``python -m benchmarks.rounding [--device cuda]``.
"""

import argparse
import time

import torch

from sx2torch.runtime.rounding import round_bits

CHUNK = 1 << 24


def count_mismatches(bits: torch.Tensor) -> int:
    """How many of the int32 patterns ``bits`` round differently from torch's cast."""
    x = bits.view(torch.float32)
    ours = round_bits(x)
    theirs = x.to(torch.bfloat16).float()
    differ = ours.view(torch.int32) != theirs.view(torch.int32)
    both_nan = ours.isnan() & theirs.isnan()
    return int((differ & ~both_nan).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    device = torch.device(parser.parse_args().device)
    offsets = torch.arange(CHUNK, dtype=torch.int32, device=device)
    mismatches = 0
    start = time.perf_counter()
    for low in range(-(1 << 31), 1 << 31, CHUNK):
        mismatches += count_mismatches(offsets + low)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    print(
        f"device {device}: {1 << 32} patterns, {mismatches} mismatches, {elapsed:.1f} s"
    )


if __name__ == "__main__":
    main()
