"""dlm's diffusion sampling on the GPU beside the PyTorch reference (torch_reference.py sample: MegaDLMs'
generate, eager and torch.compile) in one run: tokens/s and the ratio for batch 1 and 16.

--modes adds Fast-dLLM's block KV cache (torch_reference.py's generate_cached, --kv-cache prefix|dual; dlm's
diffusion_generate_cached on the GPU, cuda_sample_bench's KV_CACHE argument) and --thresholds its parallel
decoding, each row beside the exact PyTorch sampler of the same batch. With the benchmark's random weights every
confidence is low, so a threshold unmasks about one position per step; the forwards columns show how many model
calls each side made, and in brackets per generated position (1.00: one forward a token, as the exact sampler at
256 steps for 256 tokens; below 1 only where parallel decoding unmasks several positions in a step). The same
samplers on a trained model, where confidences are real: kv_study.py (scripts/device-kvstudy.sh).

usage: compare_sampling.py --bench build/benchmarks/train/cuda_sample_bench [--config megadlm-1.7b] [--batches 1,16]
                           [--modes none,prefix,dual] [--thresholds 0,0.9]
"""
import argparse
import os
import sys

from compare import run

HERE = os.path.dirname(os.path.abspath(__file__))


def per_token(result):
    """Forwards of a run, and per generated position of a row."""
    if "forwards" not in result:
        return "-"
    return f"{result['forwards']} ({result['forwards'] / result['gen']:.2f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--config", default="megadlm-1.7b")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--modes", default="none", help="KV cache modes of the PyTorch rows: none,prefix,dual")
    ap.add_argument("--thresholds", default="0", help="parallel decoding thresholds of the PyTorch rows (0: off)")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    # The exact sampler first: every row's speed-up is against it.
    modes = ["none"] + [m for m in args.modes.split(",") if m != "none"]
    thresholds = [0.0] + [float(v) for v in args.thresholds.split(",") if float(v) != 0]
    rows = []
    for b in [int(v) for v in args.batches.split(",")]:
        exact = None
        for mode in modes:
            for t in thresholds:
                ours = run([args.bench, args.config, str(b), "64", "256", "256", "32", mode, str(t)], 300)
                ref = run([args.python, os.path.join(HERE, "torch_reference.py"), "sample", "--config", args.config,
                           "--batch", str(b), "--kv-cache", mode, "--threshold", str(t)], 600)
                if mode == "none" and t == 0:
                    exact = ref
                rows.append((b, mode, t, ours, ref, exact))
    print("| batch | KV cache | threshold | dlm tokens/s | dlm forwards (per token) | "
          "PyTorch (torch.compile) tokens/s | PyTorch forwards (per token) | ratio | dlm vs the exact PyTorch sampler | PyTorch vs its exact sampler |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for b, mode, t, ours, ref, exact in rows:
        o = f"{ours['tokens_per_s']:.1f}" if ours else "failed"
        ours_calls = per_token(ours) if ours else "-"
        r = f"{ref['tokens_per_s']:.1f}" if ref else "failed"
        calls = per_token(ref) if ref else "-"
        ratio = f"{ours['tokens_per_s'] / ref['tokens_per_s']:.2f}x" if ours and ref else "-"
        ours_speedup = f"{ours['tokens_per_s'] / exact['tokens_per_s']:.2f}x" if ours and exact else "-"
        speedup = f"{ref['tokens_per_s'] / exact['tokens_per_s']:.2f}x" if ref and exact else "-"
        print(f"| {b} | {mode} | {t:g} | {o} | {ours_calls} | {r} | {calls} | {ratio} | {ours_speedup} | {speedup} |")


if __name__ == "__main__":
    main()
