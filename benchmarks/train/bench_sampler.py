"""The diffusion sampler's own cost (not the model's): dlm's host sampler beside LLaDA's torch generate
loop (the reference MegaDLMs exports), each served one fixed random logits tensor at every step
(the work does not depend on the values: both decode the same number of positions per step).

usage: bench_sampler.py [--build build] [--vocab 50304 --prompt 32 --gen 128 --steps 128 --block 32]"""
import argparse
import json
import os
import subprocess
import time

import numpy as np
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build")
ap.add_argument("--vocab", type=int, default=50304)
ap.add_argument("--prompt", type=int, default=32)
ap.add_argument("--gen", type=int, default=128)
ap.add_argument("--steps", type=int, default=128)
ap.add_argument("--block", type=int, default=32)
args = ap.parse_args()
tool = os.path.join(args.build, "benchmarks", "train", "sampler_bench")




def llada_generate(logits_fixed, prompt, gen, steps, block, temperature, remasking, mask_id):
    """LLaDA's generate() (GSAI-ML/LLaDA generate.py), with the model replaced by the fixed logits."""
    x = torch.full((1, prompt + gen), mask_id, dtype=torch.long)
    x[:, :prompt] = 5
    blocks = gen // block
    per_block = steps // blocks
    for b in range(blocks):
        block_mask = x[:, prompt + b * block: prompt + (b + 1) * block] == mask_id
        n = block_mask.sum(dim=1, keepdim=True)
        counts = torch.zeros(1, per_block, dtype=torch.int64) + n // per_block
        for i in range(1):
            counts[i, : int(n[i] % per_block)] += 1
        for i in range(per_block):
            mask_index = x == mask_id
            logits = logits_fixed
            if temperature > 0:
                l64 = logits.to(torch.float64)
                noise = torch.rand_like(l64)
                noisy = l64.exp() / (-torch.log(noise)) ** temperature
            else:
                noisy = logits
            x0 = torch.argmax(noisy, dim=-1)
            if remasking == "low_confidence":
                p = torch.nn.functional.softmax(logits.to(torch.float64), dim=-1)
                x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            else:
                x0_p = torch.rand((x0.shape[0], x0.shape[1]))
            x0_p[:, prompt + (b + 1) * block:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            _, idx = torch.topk(confidence[0], k=int(counts[0, i]))
            transfer[0, idx] = True
            x[transfer] = x0[transfer]
    return x


L = args.prompt + args.gen
print(f"vocab {args.vocab}, prompt {args.prompt}, generate {args.gen} in {args.steps} steps, blocks of {args.block}; "
      f"torch {torch.__version__} with {torch.get_num_threads()} threads; dlm single-threaded")
logits = torch.from_numpy(np.random.default_rng(0).standard_normal((1, L, args.vocab)).astype(np.float32) * 2)
print("| settings | dlm | LLaDA generate (torch) | ratio |")
print("| --- | --- | --- | --- |")
for temperature, remasking in [(0.0, "low_confidence"), (1.0, "low_confidence"), (0.0, "random")]:
    r = json.loads(subprocess.run([str(v) for v in [tool, args.vocab, args.prompt, args.gen, args.steps, args.block, temperature,
                                   remasking]], capture_output=True, text=True, check=True).stdout)
    t0 = time.perf_counter()
    llada_generate(logits, args.prompt, args.gen, args.steps, args.block, temperature, remasking, args.vocab - 1)
    ref = time.perf_counter() - t0
    ours = r["seconds"]
    print(f"| T={temperature}, {remasking} | {ours * 1e3 / args.steps:.2f} ms/step | {ref * 1e3 / args.steps:.2f} ms/step "
          f"| {ref / ours:.2f}x |")
