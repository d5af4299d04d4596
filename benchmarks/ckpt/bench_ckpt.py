"""Checkpoint save/load speed of a 350M-parameter training state (fp32 weights + AdamW moments,
4.3 GB) with dlm's native store, beside the disk's own sequential write speed (`dd bs=64M conv=fsync`)
and Python safetensors (`safetensors.torch.save_file` + fsync) writing the same bytes, in one run.

usage: .venv/bin/python benchmarks/ckpt/bench_ckpt.py [--build build] [--dir /tmp/dlm_bench_ckpt] [--tp 1 --pp 1]"""
import argparse
import os
import re
import shutil
import subprocess
import time

import torch
from safetensors.torch import save_file

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build")
ap.add_argument("--dir", default="/tmp/dlm_bench_ckpt")
ap.add_argument("--tp", default="1")
ap.add_argument("--pp", default="1")
args = ap.parse_args()
os.makedirs(args.dir, exist_ok=True)

out = subprocess.run([f"{args.build}/benchmarks/ckpt/ckpt_bench", f"{args.dir}/native", "--tp", args.tp, "--pp", args.pp],
                     check=True, capture_output=True, text=True).stdout
r = dict(re.findall(r"(\w+) ([\d.]+)", out))
nbytes = int(r["state_bytes"])
print(f"dlm native ({args.tp}x{args.pp} ranks): {int(r['params'])/1e6:.0f}M params, {nbytes/1e9:.2f} GB state: "
      f"save {float(r['save_gbps']):.2f} GB/s ({float(r['save_s']):.2f} s), load (cold cache) {float(r['load_gbps']):.2f} GB/s")

blocks = max(1, round(nbytes / (64 << 20)))
t = time.perf_counter()
subprocess.run(["dd", "if=/dev/zero", f"of={args.dir}/dd.bin", "bs=64M", f"count={blocks}", "conv=fsync"],
               check=True, capture_output=True)
dd = blocks * (64 << 20) / (time.perf_counter() - t) / 1e9
os.remove(f"{args.dir}/dd.bin")
print(f"dd bs=64M conv=fsync: {dd:.2f} GB/s")

# The same tensors (three groups of 350M fp32 values) through safetensors.
n = nbytes // 4 // 3
chunk = 1 << 24
tensors = {}
for g in ("w", "m", "v"):
    for i in range(0, n, chunk):
        tensors[f"{g}.{i}"] = torch.arange(min(chunk, n - i), dtype=torch.float32)
t = time.perf_counter()
save_file(tensors, f"{args.dir}/st.safetensors")
fd = os.open(f"{args.dir}/st.safetensors", os.O_RDONLY)
os.fsync(fd)
os.close(fd)
sts = nbytes / (time.perf_counter() - t) / 1e9
os.remove(f"{args.dir}/st.safetensors")
del tensors
print(f"python safetensors save_file + fsync: {sts:.2f} GB/s")
save = float(r["save_gbps"])
print(f"ratios: dlm save / dd = {save / dd:.2f}, dlm save / safetensors = {save / sts:.2f}")
shutil.rmtree(args.dir, ignore_errors=True)
