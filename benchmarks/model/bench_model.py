"""Forward + backward throughput on CPU (fp32): dlm's Model (CPU backend, model_bench) beside
transformers' Qwen3ForCausalLM in torch (its default SDPA attention) on the same shape, in one run.
Both compute logits over the padded vocabulary, a mean cross-entropy and every parameter gradient.

usage: .venv/bin/python benchmarks/model/bench_model.py [--build build] [--threads 2] [--batch 4 --seq 256]"""
import argparse
import os
import re
import subprocess
import time

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--iters", type=int, default=5)
ap.add_argument("--causal", action="store_true")
a = ap.parse_args()
layers, hidden, ffn, heads, groups, vocab = 4, 256, 768, 4, 2, 50277

cmd = [f"{a.build}/benchmarks/model/model_bench", "--layers", layers, "--hidden", hidden, "--ffn", ffn, "--heads",
       heads, "--groups", groups, "--vocab", vocab, "--batch", a.batch, "--seq", a.seq, "--iters", a.iters,
       "--threads", a.threads] + (["--causal"] if a.causal else [])
# OpenBLAS 0.3.21 falls back to SSE3 kernels on CPUs whose CPUID model it does not know (this VM);
# torch brings its own GEMMs. Give OpenBLAS the kernels the CPU has, as a user would (docs/model.md).
env = dict(os.environ)
if "OPENBLAS_CORETYPE" not in env:
    flags = open("/proc/cpuinfo").read()
    env["OPENBLAS_CORETYPE"] = "SkylakeX" if " avx512f" in flags else "Haswell" if " avx2" in flags else ""
print(f"OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']}")
out = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, env=env).stdout
r = dict(re.findall(r"(\w+) ([\d.]+)", out))
dlm_tps = float(r["tokens_per_s"])
print(f"dlm CPU backend ({a.threads} threads): {int(r['params'])/1e6:.1f}M params, {dlm_tps:.0f} tokens/s "
      f"({float(r['ms_per_iter']):.1f} ms per {a.batch}x{a.seq} forward+backward)")

torch.set_num_threads(a.threads)
torch.manual_seed(0)
config = transformers.Qwen3Config(vocab_size=50304, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                                  num_attention_heads=heads, num_key_value_heads=groups, head_dim=hidden // heads,
                                  max_position_embeddings=a.seq, tie_word_embeddings=False)
model = transformers.Qwen3ForCausalLM(config).float().train()
ids = torch.randint(0, vocab, (a.batch, a.seq))
labels = torch.randint(0, vocab, (a.batch, a.seq))
mask = None if a.causal else torch.zeros(a.batch, 1, a.seq, a.seq)


def step():
    model.zero_grad(set_to_none=False)
    logits = model(input_ids=ids, attention_mask=mask).logits
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
    loss.backward()


step()
t = time.perf_counter()
for _ in range(a.iters):
    step()
torch_tps = a.batch * a.seq * a.iters / (time.perf_counter() - t)
print(f"torch {torch.__version__} + transformers {transformers.__version__} Qwen3ForCausalLM ({a.threads} threads): "
      f"{torch_tps:.0f} tokens/s")
print(f"ratio dlm / torch: {dlm_tps / torch_tps:.2f}x")
