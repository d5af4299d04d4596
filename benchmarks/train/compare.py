"""dlm's CUDA training step beside the PyTorch reference, in one run on one GPU: tokens/s, MFU (989 TFLOP/s)
and the ratio, per model configuration (torch_reference.py's CONFIGS; the FLOP count is the same in both; an MoE
configuration such as moe-2.9b counts its active parameters).

usage: compare.py --bench build/benchmarks/train/cuda_train_bench [--configs 350m,qwen3-1.7b] [--steps 10]
                  [--accumulate 8] [--baseline OTHER_BUILD/cuda_train_bench]
--accumulate N: N micro-batches per optimizer step on both sides (gradient accumulation, as a real run's
global batch does: MegaDLMs' 1.7B has 256 samples of micro-batch 4, 8 micro-batches per GPU at DP 8);
the default 1 steps AdamW after every micro-batch.
--baseline B: a second build of cuda_train_bench (e.g. the commit before a change) timed in the same run, right
after this one on each configuration, with its own ratio to the same PyTorch measurement: before/after in one run.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, timeout):
    print("+", " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  timed out after {timeout} s", flush=True)
        return None
    sys.stdout.write(p.stderr[-3000:])
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        print(f"  failed (exit {p.returncode}): {p.stdout[-2000:]}", flush=True)
        return None
    print("  " + lines[-1], flush=True)
    return json.loads(lines[-1])


def parser(configs):
    """The arguments every comparison takes: the benchmark binary, the configurations, timed steps, PyTorch's python."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--configs", default=configs)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--python", default=sys.executable)
    return ap


def main():
    ap = parser("350m,qwen3-1.7b")
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--baseline", default=None)
    args = ap.parse_args()
    rows = []
    for cfg in args.configs.split(","):
        bench_args = [cfg, str(args.steps), "3", str(args.accumulate)]
        ours = run([args.bench] + bench_args, 180 * args.accumulate)
        base = run([args.baseline] + bench_args, 180 * args.accumulate) if args.baseline else None
        ref = run([args.python, os.path.join(HERE, "torch_reference.py"), "train", "--config", cfg,
                   "--steps", str(args.steps), "--warmup", "3", "--accumulate", str(args.accumulate)],
                  330 + 150 * (args.accumulate - 1))
        rows.append((cfg, ours, ref, base))
    print(f"micro-batches per optimizer step: {args.accumulate}")
    print("| model | dlm tokens/s | dlm MFU | dlm GiB | PyTorch tokens/s | PyTorch MFU | PyTorch GiB | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for cfg, ours, ref, base in rows:
        r = f"{ref['tokens_per_s']:.0f} | {100 * ref['mfu']:.1f}% | {ref['peak_gib']:.1f}" if ref else "failed | | "
        for name, got in [(cfg, ours)] + ([(cfg + " (baseline)", base)] if args.baseline else []):
            o = f"{got['tokens_per_s']:.0f} | {100 * got['mfu']:.1f}% | {got['peak_gib']:.1f}" if got else "failed | | "
            ratio = f"{got['tokens_per_s'] / ref['tokens_per_s']:.3f}x" if got and ref else "-"
            print(f"| {name} | {o} | {r} | {ratio} |")


if __name__ == "__main__":
    main()
