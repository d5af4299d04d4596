"""dlm's diffusion sampling on the GPU beside the PyTorch reference (torch_reference.py sample: MegaDLMs'
generate, eager and torch.compile) in one run: tokens/s and the ratio for batch 1 and 16.

usage: compare_sampling.py --bench build/benchmarks/train/cuda_sample_bench [--config megadlm-1.7b] [--batches 1,16]
"""
import argparse
import os
import sys

from compare import run

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--config", default="megadlm-1.7b")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    rows = []
    for b in [int(v) for v in args.batches.split(",")]:
        ours = run([args.bench, args.config, str(b), "64", "256", "256", "32"], 300)
        ref = run([args.python, os.path.join(HERE, "torch_reference.py"), "sample", "--config", args.config,
                   "--batch", str(b)], 400)
        rows.append((b, ours, ref))
    print("| batch | dlm tokens/s | PyTorch (torch.compile) tokens/s | ratio |")
    print("| --- | --- | --- | --- |")
    for b, ours, ref in rows:
        o = f"{ours['tokens_per_s']:.1f}" if ours else "failed"
        r = f"{ref['tokens_per_s']:.1f}" if ref else "failed"
        ratio = f"{ours['tokens_per_s'] / ref['tokens_per_s']:.2f}x" if ours and ref else "-"
        print(f"| {b} | {o} | {r} | {ratio} |")


if __name__ == "__main__":
    main()
