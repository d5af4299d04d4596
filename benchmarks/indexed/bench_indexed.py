"""libdata's IndexedDataset reader beside megatron-core's, on the same dataset, in one run.

usage: .venv/bin/python benchmarks/indexed/bench_indexed.py [--gb 1.0] [--random 200000] [--len 2049]
Builds a synthetic uint16 dataset (log-normal document lengths) with build/benchmarks/indexed/indexed_read_bench,
warms the page cache, then times a sequential scan (every token summed) and random slices (GPTDataset-style
reads of --len tokens) with both readers and prints the rates and ratios."""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy
from megatron.core.datasets.indexed_dataset import IndexedDataset

ap = argparse.ArgumentParser()
ap.add_argument("--gb", type=float, default=1.0)
ap.add_argument("--random", type=int, default=200000)
ap.add_argument("--len", type=int, default=2049)
ap.add_argument("--bench", default="build/benchmarks/indexed/indexed_read_bench")
ap.add_argument("--dir", default=None)
args = ap.parse_args()

work = args.dir or tempfile.mkdtemp(prefix="dlm_bench_indexed_")
os.makedirs(work, exist_ok=True)
prefix = os.path.join(work, "synthetic")
if not os.path.exists(prefix + ".idx"):
    print(subprocess.run([args.bench, "make", prefix, str(args.gb)], check=True, capture_output=True, text=True).stdout.strip())
with open(prefix + ".bin", "rb") as f:  # warm the page cache for both readers
    while f.read(1 << 24):
        pass


def ours(mode, *extra):
    out = subprocess.run([args.bench, mode, prefix, *map(str, extra)], check=True, capture_output=True, text=True).stdout
    fields = dict(kv.split("=") for kv in out.split()[1:])
    return int(fields["items"]), int(fields["tokens"]), int(fields["checksum"]), float(fields["seconds"])


def megatron_scan():
    t0 = time.perf_counter()
    ds = IndexedDataset(prefix)
    checksum = tokens = 0
    for i in range(len(ds)):
        seq = ds[i]
        checksum += int(seq.sum(dtype=numpy.uint64))
        tokens += len(seq)
    return len(ds), tokens, checksum, time.perf_counter() - t0


def megatron_random(count, length):
    ds = IndexedDataset(prefix)
    lengths = ds.sequence_lengths
    state = 42
    mask = (1 << 64) - 1

    def nxt():
        nonlocal state
        state = (state * 6364136223846793005 + 1442695040888963407) & mask
        return state >> 33

    t0 = time.perf_counter()
    checksum = tokens = 0
    for _ in range(count):
        i = nxt() % len(ds)
        n = int(lengths[i])
        take = min(length, n)
        offset = 0 if n - take == 0 else nxt() % (n - take + 1)
        seq = ds.get(i, offset, take)
        checksum += int(seq.sum(dtype=numpy.uint64))
        tokens += take
    return count, tokens, checksum, time.perf_counter() - t0


size_gb = os.path.getsize(prefix + ".bin") / 1e9
rows = []
for name, mine, theirs in [
    ("sequential scan", lambda: ours("scan"), megatron_scan),
    (f"random {args.len}-token slices", lambda: ours("random", args.random, args.len),
     lambda: megatron_random(args.random, args.len)),
]:
    a, b = mine(), theirs()
    if a[:3] != b[:3]:
        sys.exit(f"{name}: readers disagree: dlm {a[:3]} vs megatron-core {b[:3]}")
    rows.append((name, a, b))

print(f"dataset: {size_gb:.2f} GB uint16, {rows[0][1][0]} sequences ({prefix})")
print(f"{'read':<28} {'dlm':>22} {'megatron-core':>22} {'ratio':>7}")
for name, a, b in rows:
    rate = lambda r: f"{r[1] * 2 / r[3] / 1e9:6.2f} GB/s {r[0] / r[3] / 1e3:8.1f}k/s"
    print(f"{name:<28} {rate(a):>22} {rate(b):>22} {b[3] / a[3]:6.1f}x")
