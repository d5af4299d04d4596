"""dlm's diffusion sampling on the GPU beside the PyTorch reference (torch_reference.py sample: MegaDLMs'
generate under torch.compile) in one run: tokens/s and the ratio per batch.

--modes adds Fast-dLLM's block KV cache (torch_reference.py's generate_cached, --kv-cache prefix|dual; dlm's
diffusion_generate_cached on the GPU, cuda_sample_bench's KV_CACHE argument) and --thresholds its parallel
decoding, each row beside the exact PyTorch sampler of the same batch. With the benchmark's random weights every
confidence is low, so a threshold unmasks about one position per step; the forwards columns show how many model
calls each side made, and in brackets per generated position (1.00: one forward a token, as the exact sampler at
256 steps for 256 tokens; below 1 only where parallel decoding unmasks several positions in a step). The same
samplers on a trained model, where confidences are real: kv_study.py (scripts/device-kvstudy.sh).

PyTorch runs one process per mode for all of its batches and thresholds, so each mode compiles once (the exact
sampler once per batch; the cached sampler's layers once with dynamic shapes: torch_reference.py's sample). At the
1.7B shape the compilations take minutes, so a device call of a few minutes runs one mode (a chunk) and saves its
rows (--save); --load adds earlier chunks' rows (the exact sampler's, for the speed-ups), and --table prints the
table of saved chunks without running anything.
--fp8 times dlm's rows a second time with `cuda_sample_bench --fp8` (dlm-generate --fp8: the layers' GEMMs in FP8
e4m3; PyTorch stays bf16), in the same run, as the columns "dlm FP8" beside dlm's bf16.

usage: compare_sampling.py --bench build/benchmarks/train/cuda_sample_bench [--config megadlm-1.7b] [--batches 1,16]
                           [--modes none,prefix,dual] [--thresholds 0,0.9] [--save FILE] [--load FILE ...]
                           [--fp8]
       compare_sampling.py --table FILE ...
e.g. three chunks: --modes none --thresholds 0 --save none.json; --modes prefix --save prefix.json;
     --modes dual --save dual.json; then --table none.json prefix.json dual.json.
"""
import argparse
import json
import os
import subprocess
import sys
import threading

from compare import run

HERE = os.path.dirname(os.path.abspath(__file__))


def run_lines(cmd, timeout):
    """The JSON lines cmd printed before it exited or was stopped at `timeout` seconds (the rows it finished)."""
    print("+", " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, err = [], []

    def read(stream, into, echo):
        for line in stream:
            into.append(line)
            if echo and line.startswith("{"):
                print("  " + line.rstrip(), flush=True)

    readers = [threading.Thread(target=read, args=(p.stdout, lines, True)),
               threading.Thread(target=read, args=(p.stderr, err, False))]
    for t in readers:
        t.start()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        print(f"  stopped after {timeout} s", flush=True)
    for t in readers:
        t.join()
    if p.returncode != 0:
        sys.stdout.write("".join(err)[-3000:])
    return [json.loads(line) for line in lines if line.startswith("{")]


def per_token(result):
    """Forwards of a run, and per generated position of a row."""
    if not result or "forwards" not in result:
        return "-"
    return f"{result['forwards']} ({result['forwards'] / result['gen']:.2f})"


def measure(args):
    """This run's rows: per mode, dlm's (one cuda_sample_bench per row), then PyTorch's (one process per mode)."""
    batches = [int(v) for v in args.batches.split(",")]
    thresholds = [float(v) for v in args.thresholds.split(",")]
    rows = []
    for mode in args.modes.split(","):
        ours, fp8 = {}, {}
        for b in batches:
            for t in thresholds:
                shape = [args.config, str(b), "64", "256", "256", "32", mode, str(t)]
                ours[(b, t)] = run([args.bench, *shape], 300)
                if args.fp8:
                    fp8[(b, t)] = run([args.bench, "--fp8", *shape], 300)
        got = run_lines([args.python, os.path.join(HERE, "torch_reference.py"), "sample", "--config", args.config,
                         "--kv-cache", mode, "--batches", args.batches, "--thresholds", args.thresholds],
                        args.torch_timeout)
        ref = {(r["batch"], r["threshold"]): r for r in got}
        rows += [dict(batch=b, mode=mode, threshold=t, dlm=ours[(b, t)], torch=ref.get((b, t)),
                      **({"dlm_fp8": fp8[(b, t)]} if args.fp8 else {}))
                 for b in batches for t in thresholds]
        if args.save:  # after each mode: a later one's failure keeps these
            json.dump(rows, open(args.save, "w"))
    return rows


def table(rows):
    exact = {r["batch"]: r["torch"] for r in rows if r["mode"] == "none" and r["threshold"] == 0 and r["torch"]}
    order = {"none": 0, "prefix": 1, "dual": 2}
    with_fp8 = any("dlm_fp8" in r for r in rows)
    lines = ["| batch | KV cache | threshold | dlm tokens/s | dlm forwards (per token) | "
             "PyTorch (torch.compile) tokens/s | PyTorch forwards (per token) | dlm / PyTorch | "
             "dlm / exact PyTorch | PyTorch / exact PyTorch |" +
             (" dlm FP8 tokens/s | dlm FP8 / exact PyTorch |" if with_fp8 else ""),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if with_fp8 else "")]
    for r in sorted(rows, key=lambda r: (r["batch"], order.get(r["mode"], 3), r["threshold"])):
        ours, ref, ex = r["dlm"], r["torch"], exact.get(r["batch"])
        o = f"{ours['tokens_per_s']:.1f}" if ours else "failed"
        p = f"{ref['tokens_per_s']:.1f}" if ref else "failed"
        ratio = f"{ours['tokens_per_s'] / ref['tokens_per_s']:.2f}x" if ours and ref else "-"
        ours_speedup = f"{ours['tokens_per_s'] / ex['tokens_per_s']:.2f}x" if ours and ex else "-"
        speedup = f"{ref['tokens_per_s'] / ex['tokens_per_s']:.2f}x" if ref and ex else "-"
        f8 = r.get("dlm_fp8")
        fp8_cells = ""
        if with_fp8:
            fp8_cells = (f" {f8['tokens_per_s']:.1f} | " if f8 else " - | ") + \
                (f"{f8['tokens_per_s'] / ex['tokens_per_s']:.2f}x |" if f8 and ex else "- |")
        lines.append(f"| {r['batch']} | {r['mode']} | {r['threshold']:g} | {o} | {per_token(ours)} | {p} | "
                     f"{per_token(ref)} | {ratio} | {ours_speedup} | {speedup} |{fp8_cells}")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench")
    ap.add_argument("--config", default="megadlm-1.7b")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--modes", default="none", help="KV cache modes: none,prefix,dual (each with every threshold)")
    ap.add_argument("--thresholds", default="0", help="parallel decoding thresholds (0: off)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--fp8", action="store_true", help="dlm's rows also with cuda_sample_bench --fp8")
    ap.add_argument("--torch-timeout", type=int, default=480, help="seconds for one mode's PyTorch process")
    ap.add_argument("--save", help="write this run's rows (JSON) here")
    ap.add_argument("--load", nargs="*", default=[], help="earlier runs' rows (--save files) for the table")
    ap.add_argument("--table", nargs="*", help="print the table of these --save files and run nothing")
    args = ap.parse_args()
    if args.table is not None:
        rows = [r for f in args.table for r in json.load(open(f))]
    else:
        if not args.bench:
            ap.error("--bench is required unless --table")
        rows = [r for f in args.load for r in json.load(open(f))] + measure(args)
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
