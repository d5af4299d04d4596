"""dlm-blend build beside megatron-core's BlendedMegatronDatasetBuilder, on the same inputs, in one run.

Writes --datasets synthetic uint16 datasets of --docs documents each (log-normal lengths, mean ~500
tokens: 10M documents are ~5B tokens). Only the .idx is real; the .bin is a sparse file of the right
size, since building the index reads nothing else. Then, each in its own child process under
/usr/bin/time -v (wall time and peak RSS of that process alone), with an empty cache folder:
megatron-core's BlendedMegatronDatasetBuilder(GPTDataset, ...).build() as Megatron-LM calls it for
--data-path "w1 p1 ..." --split --seq-length --train-samples --eval-iters --eval-interval, and
`dlm-blend build` with the same flags. Every cache file must come out with the same name and bytes.
Prints both sides' build time (inside the process), process time, peak RSS, and the ratios.

usage: .venv/bin/python benchmarks/blend/bench_blend.py --tool build-blend/tools/dlm-blend/dlm-blend
       [--docs 10000000] [--datasets 3] [--seq 2048] [--train-samples 10000000] [--repeat 3] [--dir DIR]"""
import argparse
import filecmp
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy


def write_dataset(prefix, docs, seed):
    """A Megatron .idx (version 1, uint16, one sequence per document) and a sparse .bin to match."""
    rng = numpy.random.default_rng(seed)
    # Web-text-like: median ~300 tokens, a long tail of books and code files (mean ~500).
    lengths = numpy.clip(rng.lognormal(5.7, 1.0, docs), 8, 200_000).astype(numpy.int32)
    pointers = numpy.zeros(docs, dtype=numpy.int64)
    numpy.cumsum(lengths[:-1].astype(numpy.int64) * 2, out=pointers[1:])
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(numpy.array([1], dtype=numpy.uint64).tobytes())
        f.write(numpy.array([8], dtype=numpy.uint8).tobytes())  # uint16 tokens
        f.write(numpy.array([docs, docs + 1], dtype=numpy.uint64).tobytes())
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(numpy.arange(docs + 1, dtype=numpy.int64).tobytes())
    with open(prefix + ".bin", "wb") as f:
        f.truncate(int(lengths.sum(dtype=numpy.int64)) * 2)
    return int(lengths.sum(dtype=numpy.int64))


def megatron_child(a):
    """Runs in the child: Megatron-LM's dataset construction, timed apart from the imports."""
    t0 = time.perf_counter()
    import logging

    logging.disable(logging.WARNING)
    import torch.distributed
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    # BlendedDataset asks torch.distributed for its rank, as under torchrun with one process.
    torch.distributed.init_process_group("gloo", init_method=f"file://{a.cache}.rendezvous", rank=0, world_size=1)
    t1 = time.perf_counter()
    import_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cfg = GPTDatasetConfig(random_seed=a.seed, sequence_length=a.seq, blend=get_blend_from_list(a.data_path.split()),
                           split=a.split, path_to_cache=a.cache, tokenizer=NullTokenizer(a.vocab),
                           reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                           create_attention_mask=False, mid_level_dataset_surplus=0.005)
    sizes = split_sizes(a)
    BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, cfg).build()
    t2 = time.perf_counter()
    torch.distributed.destroy_process_group()
    print(json.dumps({"import_s": t1 - t0, "build_s": t2 - t1, "import_rss_mb": import_rss}))


def split_sizes(a):
    """Megatron-LM's train_valid_test_num_samples with --global-batch-size 1."""
    return [a.train_samples, (a.train_samples // a.eval_interval + 1) * a.eval_iters, a.eval_iters]


def timed(cmd):
    """Runs cmd under /usr/bin/time -v: (stdout, stderr without time's report, wall s, CPU s, peak RSS MB)."""
    p = subprocess.run(["/usr/bin/time", "-v", *map(str, cmd)], capture_output=True, text=True)
    report = p.stderr[p.stderr.rfind("\tCommand being timed"):]
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stderr}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", report).group(1)
    seconds = sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall.split(":"))))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", report).group(1)) / 1024
    cpu = sum(float(re.search(rf"{k} time \(seconds\): ([0-9.]+)", report).group(1)) for k in ("User", "System"))
    return p.stdout, p.stderr[: p.stderr.rfind("\tCommand being timed")], seconds, cpu, rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", default="build-blend/tools/dlm-blend/dlm-blend")
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--datasets", type=int, default=3)
    ap.add_argument("--weights", default="0.5,0.3,0.2")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--train-samples", type=int, default=10_000_000)
    ap.add_argument("--eval-iters", type=int, default=100)
    ap.add_argument("--eval-interval", type=int, default=1000)
    ap.add_argument("--split", default="969,30,1")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="keeps the synthetic datasets between runs")
    ap.add_argument("--megatron-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data-path", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.megatron_child:
        return megatron_child(a)

    work = a.dir or tempfile.mkdtemp(prefix="dlm_bench_blend_")
    os.makedirs(work, exist_ok=True)
    weights = a.weights.split(",")[: a.datasets]
    words, tokens = [], 0
    for d in range(a.datasets):
        prefix = os.path.join(work, f"synthetic{d}_{a.docs}")
        if not os.path.exists(prefix + ".idx"):
            write_dataset(prefix, a.docs, seed=d)
        with open(prefix + ".idx", "rb") as f:  # both builders find the .idx in the page cache
            while f.read(1 << 24):
                pass
        tokens += os.path.getsize(prefix + ".bin") // 2
        words += [weights[d], prefix] if a.datasets > 1 else [prefix]
    data_path = " ".join(words)

    caches = {k: os.path.join(work, f"cache-{k}") for k in ("megatron", "dlm")}
    for c in caches.values():
        shutil.rmtree(c, ignore_errors=True)
    flags = ["--seq-length", a.seq, "--train-samples", a.train_samples, "--global-batch-size", 1, "--eval-iters",
             a.eval_iters, "--eval-interval", a.eval_interval, "--seed", a.seed, "--split", a.split]
    child = ["--megatron-child", "--data-path", data_path, "--cache", caches["megatron"], "--seq", a.seq, "--train-samples",
             a.train_samples, "--eval-iters", a.eval_iters, "--eval-interval", a.eval_interval, "--seed", a.seed,
             "--split", a.split, "--vocab", a.vocab]
    # Runs alternate (megatron, dlm, megatron, ...) so both see the same load; medians are printed.
    runs = []
    for _ in range(a.repeat):
        for c in caches.values():
            shutil.rmtree(c, ignore_errors=True)
        out, _, m_wall, m_cpu, m_rss = timed([sys.executable, os.path.abspath(__file__), *child])
        m = json.loads(out.strip().splitlines()[-1])
        _, err, d_wall, d_cpu, d_rss = timed([a.tool, "build", "--data-path", data_path, "--data-cache-path", caches["dlm"],
                                              *flags])
        d_build = float(re.search(r"built in ([0-9.]+) s", err).group(1))

        names = sorted(os.listdir(caches["megatron"]))
        if names != sorted(os.listdir(caches["dlm"])):
            sys.exit(f"cache files differ:\n megatron {names}\n dlm      {sorted(os.listdir(caches['dlm']))}")
        for n in names:
            if not filecmp.cmp(os.path.join(caches["megatron"], n), os.path.join(caches["dlm"], n), shallow=False):
                sys.exit(f"{n}: megatron-core and dlm wrote different bytes")
        runs.append((m["build_s"], d_build, m_wall, d_wall, m["import_s"], m_cpu, d_cpu, m_rss, d_rss, m["import_rss_mb"]))
        print("run: " + " ".join(f"{v:.2f}" for v in runs[-1]), flush=True)
    (m_build, d_build, m_wall, d_wall, m_import, m_cpu, d_cpu, m_rss, d_rss,
     m_import_rss) = (statistics.median(col) for col in zip(*runs))
    m = {"build_s": m_build, "import_s": m_import, "import_rss_mb": m_import_rss}
    arrays = sum(n.endswith(".npy") for n in names)
    cache_mb = sum(os.path.getsize(os.path.join(caches["dlm"], n)) for n in names) / 1e6

    print(f"inputs: {a.datasets} dataset(s) x {a.docs / 1e6:g}M documents, {tokens / 1e9:.2f}B tokens in all; "
          f"--data-path \"{' '.join(weights) if a.datasets > 1 else '(one prefix)'}\" --split {a.split} "
          f"--seq-length {a.seq} --train-samples {a.train_samples}")
    print(f"output: {arrays} arrays ({cache_mb:.0f} MB), identical bytes and names in each of {a.repeat} runs "
          f"(medians below)")
    print(f"{'':<24} {'megatron-core':>14} {'dlm-blend':>12} {'ratio':>8}")
    print(f"{'index build (s)':<24} {m['build_s']:>14.2f} {d_build:>12.2f} {m['build_s'] / d_build:>7.1f}x")
    print(f"{'process wall (s)':<24} {m_wall:>14.2f} {d_wall:>12.2f} {m_wall / d_wall:>7.1f}x")
    print(f"{'  of which imports (s)':<24} {m['import_s']:>14.2f} {'-':>12}")
    print(f"{'process CPU (s)':<24} {m_cpu:>14.2f} {d_cpu:>12.2f} {m_cpu / d_cpu:>7.1f}x")
    print(f"{'peak RSS (MB)':<24} {m_rss:>14.0f} {d_rss:>12.0f} {d_rss / m_rss:>7.2f}x")
    print(f"{'  after imports (MB)':<24} {m['import_rss_mb']:>14.0f} {'-':>12}")
    for c in caches.values():
        shutil.rmtree(c, ignore_errors=True)
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
