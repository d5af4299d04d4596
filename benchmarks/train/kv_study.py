"""The block KV cache's speed and quality on a trained model (issue 34; scripts/device-kvstudy.sh runs it on the GPU).

1. dlm-train trains a model (--shape 350m on the GPU; tiny for a CPU dry run of the same code) on real text
   (scripts/dev/make_textdata.py) with the masked-diffusion objective for --train-iters iterations (capped at
   --train-minutes), and dlm-ckpt exports it to Hugging Face files.
2. dlm-generate continues the held-out prompts (one call per sampler, all prompts in one batch, greedy, --gen
   new tokens, --gen steps, blocks of --block) with each sampler: each of --modes (the exact sampler none, prefix
   and dual cache at the default refresh: a full forward at each block's start) without parallel decoding and
   with each of --thresholds (a step unmasks every position above it, the most confident at least).
3. Quality: each continuation's score under the trained model (PyTorch, the exported weights), the masked-
   diffusion bound of its negative log-likelihood given the prompt, in nats per token:
       score = mean over k = 1..K and r = 1..R of  sum over masked j of -log p(y_j | prompt, y masked) / (t_k G)
   with t_k = (k - 1/2) / K, a continuation position masked when u[r, k, row, j] < t_k, the prompt never masked,
   u drawn once from torch.Generator seeded --score-seed (the same masks for every sampler). K = 8, R = 2.
   The prompts' own text continuation is scored the same way (the `reference` row). Agreement: the fraction of
   generated positions equal to the exact sampler's.
4. Speed: tokens/s of each sampler at --timing-batches prompts (with a threshold: the first of them only),
   dlm-generate --report-speed (a warm-up run, then the
   timed one) and PyTorch (torch_reference's generate and generate_cached on the same weights, bf16 on the GPU,
   eager unless --torch-compile), with model forwards per generated token.
   --fp8-modes samples those modes again with dlm-generate --fp8 (the layers' GEMMs in FP8 e4m3), at threshold 0
   and at the first of --thresholds: rows MODE+fp8, scored and timed as the others, beside PyTorch's bf16 sampler of
   the same cache (PyTorch has no FP8 sampler here). PyTorch's timing runs last, and what of
   it would start after --budget-minutes of the study is skipped (the device call has a hard limit).
Writes OUT/kvstudy.md (the tables) and OUT/kvstudy.json.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_weights import load_export  # noqa: E402
from torch_reference import generate, generate_cached  # noqa: E402

SHAPES = {  # dlm-train's model flags; 350m is scripts/device-common.sh's FLAGS_350M shape
    "350m": ["--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--group-query-attention",
             "--num-query-groups", "8", "--ffn-hidden-size", "2816"],
    "tiny": ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--group-query-attention",
             "--num-query-groups", "2", "--ffn-hidden-size", "176"],
}
VOCAB, MASK = 50304, 50277  # GPT-NeoX (MegaDLMs) padded to 50304; its <|mask_token|>


def sh(cmd, log, timeout, stdin=None):
    """Runs cmd, its stdout and stderr appended to log; returns (stdout, stderr); raises on failure."""
    t0 = time.time()
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n{p.stdout[-20000:]}{p.stderr[-20000:]}[exit {p.returncode}, "
                f"{time.time() - t0:.1f} s]\n")
    if p.returncode != 0:
        raise SystemExit(f"kv_study: {cmd[0]} exited {p.returncode}; see {log}:\n{p.stderr[-2000:]}")
    return p.stdout, p.stderr


def train(a, log):
    ckpt = os.path.join(a.work, "ckpt")
    for old in ("ckpt", "hf", "cache"):  # a rerun on a warm machine starts over
        shutil.rmtree(os.path.join(a.work, old), ignore_errors=True)
    cmd = [os.path.join(a.bin, "dlm-train"), *SHAPES[a.shape], "--data-path", a.data, "--split", "100,0,0",
           "--data-cache-path", os.path.join(a.work, "cache"), "--seq-length", str(a.seq), "--max-position-embeddings",
           str(a.seq), "--qk-layernorm", "--norm-epsilon", "1e-6", "--vocab-size", str(VOCAB),
           "--mask-token", str(MASK),
           "--micro-batch-size", str(a.micro_batch), "--global-batch-size", str(a.global_batch),
           "--train-iters", str(a.train_iters), "--exit-duration-in-mins", str(a.train_minutes),
           "--lr", str(a.lr), "--min-lr", str(a.lr / 10), "--lr-decay-style", "cosine",
           "--lr-warmup-iters", str(min(100, a.train_iters // 10)), "--weight-decay", "0.1", "--adam-beta2", "0.95",
           "--clip-grad", "1.0", "--log-interval", str(a.log_interval), "--seed", "11", "--device", a.device,
           "--save", ckpt, *(["--bf16"] if a.device == "cuda" else [])]
    t0 = time.time()
    out, err = sh(cmd, log, timeout=int(a.train_minutes * 60) + 300)
    losses = re.findall(r"iteration\s+(\d+)/.*?lm loss:?\s*([0-9.eE+-]+)", out + err)
    return ckpt, dict(seconds=time.time() - t0, losses=[(int(i), float(v)) for i, v in losses])


def dlm_generate(a, ckpt, prompts, mode, threshold, log, speed=False):
    """Generated ids of each prompt (and dlm-generate's speed line when speed)."""
    mode, fp8 = base_mode(mode), mode.endswith("+fp8")
    cmd = [os.path.join(a.bin, "dlm-generate"), "--load", ckpt, "--tokenizer-type", "NullTokenizer",
           "--tokenizer-model", "none", "--vocab-size", str(VOCAB), "--mask-token", str(MASK),
           "--max-new-tokens", str(a.gen), "--sample-steps", str(a.gen), "--inference-block-size", str(a.block),
           "--kv-cache", mode, "--threshold", str(threshold), "--no-eos-stop", "--device", a.device,
           *(["--report-speed"] if speed else []), *(["--fp8"] if fp8 else [])]
    out, err = sh(cmd, log, timeout=600, stdin="".join(" ".join(map(str, p)) + "\n" for p in prompts))
    rows = [list(map(int, line.split())) for line in out.splitlines() if re.fullmatch(r"\d+( \d+)*", line)]
    if len(rows) != len(prompts) or any(r[:len(p)] != p or len(r) != len(p) + a.gen for r, p in zip(rows, prompts)):
        raise SystemExit(f"kv_study: dlm-generate {mode} {threshold}: unexpected output (see {log})")
    gen = [r[len(p):] for r, p in zip(rows, prompts)]
    if not speed:
        return gen, None
    m = re.search(r"speed: (\d+) rows, (\d+) tokens in ([0-9.]+) s, ([0-9.]+) tokens/s, (\d+) forwards", err)
    return gen, dict(seconds=float(m.group(3)), tokens_per_s=float(m.group(4)), forwards=int(m.group(5)))


def base_mode(mode):
    """The --kv-cache mode of a sampler's mode name (MODE or MODE+fp8)."""
    return mode.removesuffix("+fp8")


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def torch_sample(a, model, c, prompts, mode, threshold, dev):
    """PyTorch's tokens and speed for one sampler: a warm-up at the timed run's shapes, then the timed run. Under
    --torch-compile the exact sampler compiles the model per shape and the cached one its layers once, with dynamic
    shapes (torch_reference.Model.compile_layers, as torch_reference.py sample does)."""
    x = torch.tensor(prompts, device=dev)
    if a.torch_compile:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        if not hasattr(model, "layer_kv"):
            model.compile_layers()
    if mode == "none" and threshold <= 0:
        fwd = torch.compile(model) if a.torch_compile else model
        run = lambda steps: (generate(fwd, x, a.gen, steps, a.block, MASK), steps)  # noqa: E731
    else:
        run = lambda steps: generate_cached(model.forward_kv, x, a.gen, steps, a.block, MASK,  # noqa: E731
                                            c["head_dim"], mode, 0, threshold)
    run(2 * (a.gen // a.block))
    sync(dev)
    t0 = time.perf_counter()
    out, calls = run(a.gen)
    sync(dev)
    dt = time.perf_counter() - t0
    return out[:, x.shape[1]:].tolist(), dict(seconds=dt, tokens_per_s=len(prompts) * a.gen / dt, forwards=calls)


@torch.no_grad()
def score(a, model, prompts, conts, dev, k_ratios=8, draws=2, rows_per_forward=16):
    """Per continuation, the masked-diffusion NLL bound (module docstring), nats per token."""
    p, g = len(prompts[0]), len(conts[0])
    gen = torch.Generator().manual_seed(a.score_seed)
    u = torch.rand(draws, k_ratios, len(prompts), g, generator=gen)
    ratios = [(k + 0.5) / k_ratios for k in range(k_ratios)]
    total = torch.zeros(len(prompts), dtype=torch.float64)
    for r in range(draws):
        for ki, t in enumerate(ratios):
            for lo in range(0, len(prompts), rows_per_forward):
                hi = min(lo + rows_per_forward, len(prompts))
                y = torch.tensor(conts[lo:hi], device=dev)
                masked = (u[r, ki, lo:hi] < t).to(dev)
                x = torch.cat([torch.tensor(prompts[lo:hi], device=dev), torch.where(masked, MASK, y)], dim=1)
                logp = torch.log_softmax(model(x)[:, p:].float(), dim=-1)
                nll = -logp.gather(-1, y[..., None]).squeeze(-1)
                total[lo:hi] += (nll * masked).sum(dim=1).double().cpu() / (t * g)
    return (total / (draws * k_ratios)).tolist()


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, help="folder with dlm-train, dlm-generate, dlm-ckpt")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="350m")
    ap.add_argument("--data", default=".textdata/text_text_document")
    ap.add_argument("--prompts", default=".textdata/prompts.txt")
    ap.add_argument("--references", default=".textdata/references.txt")
    ap.add_argument("--tokenizer", default=".textdata/tokenizer/tokenizer.json", help="to print examples as text")
    ap.add_argument("--prompt-count", type=int, default=64)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--train-iters", type=int, default=1500)
    ap.add_argument("--train-minutes", type=float, default=4.5, help="dlm-train --exit-duration-in-mins")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (cosine to a tenth of it)")
    ap.add_argument("--modes", default="none,prefix,dual", help="--kv-cache modes, each a sampler at threshold 0")
    ap.add_argument("--thresholds", default="0.9,0.7,0.5",
                    help="each mode again with each of these --threshold values (parallel decoding)")
    ap.add_argument("--fp8-modes", default="",
                    help="these modes again with dlm-generate --fp8, at threshold 0 and the first of --thresholds")
    ap.add_argument("--log-interval", type=int, default=50)
    ap.add_argument("--timing-batches", default="1,16")
    ap.add_argument("--torch-compile", action="store_true")
    ap.add_argument("--budget-minutes", type=float, default=8.3,
                    help="PyTorch's timing rows still to run past this many minutes of the study are skipped")
    ap.add_argument("--score-seed", type=int, default=1234)
    ap.add_argument("--work", default="/tmp/kvstudy")
    ap.add_argument("--out", default="/tmp/kvstudy-out")
    return ap.parse_args()


def agree(x, y):
    """The fraction of positions where rows x and y hold the same token."""
    return sum(p == q for rx, ry in zip(x, y) for p, q in zip(rx, ry)) / sum(len(r) for r in x)


def samplers(a):
    """(mode, threshold) of every sampler, the exact one (none, 0) first: its score is every row's baseline."""
    modes = ["none"] + [m for m in a.modes.split(",") if m != "none"]
    thresholds = [float(t) for t in a.thresholds.split(",") if t and float(t) > 0]
    fp8 = [m + "+fp8" for m in a.fp8_modes.split(",") if m]
    return ([(m, 0.0) for m in modes] + [(m, t) for t in thresholds for m in modes] +
            [(m, t) for t in [0.0, *thresholds[:1]] for m in fp8])


def timed_batches(a, threshold):
    """The batches a sampler is timed at: every --timing-batches without parallel decoding, the first with it (what a
    threshold changes is the forwards a token, which the first batch shows; the study must fit one device call)."""
    batches = [int(b) for b in a.timing_batches.split(",")]
    return batches if threshold <= 0 else batches[:1]


def quality_table(a, gens, scores, refs, speeds):
    """Per sampler: forwards per token and dlm's speed at the first timing batch, agreement and score."""
    exact = scores[("none", 0.0)]
    base = sum(exact) / len(exact)
    b = int(a.timing_batches.split(",")[0])
    lines = [f"| sampler | threshold | forwards/token (batch {b}) | dlm tokens/s (batch {b}) | agreement with exact | "
             "score (nats/token) | score / exact | difference from exact (95% CI) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key in [*samplers(a), "reference"]:
        s = scores[key]
        d = [x - y for x, y in zip(s, exact)]
        mean_d = sum(d) / len(d)
        half = 1.96 * math.sqrt(sum((v - mean_d) ** 2 for v in d) / max(1, len(d) - 1) / len(d))
        name, t = key if key != "reference" else ("reference (the text's own continuation)", None)
        rows = gens[key] if key != "reference" else refs
        sp = speeds.get(("dlm", *key, b)) if key != "reference" else None
        fw = f"{sp['forwards'] / a.gen:.3f} | {sp['tokens_per_s']:.0f}" if sp else "- | -"
        lines.append(f"| {name} | {'-' if t is None else f'{t:g}'} | {fw} | "
                     f"{100 * agree(rows, gens[('none', 0.0)]):.1f}% "
                     f"| {sum(s) / len(s):.3f} | {sum(s) / len(s) / base:.3f} | {mean_d:+.3f} +- {half:.3f} |")
    return lines


def speed_table(a, speeds, gens, torch_tokens):
    lines = ["| sampler | threshold | batch | dlm tokens/s | dlm forwards/token | PyTorch tokens/s | "
             "PyTorch forwards/token | dlm / PyTorch | dlm / PyTorch exact | PyTorch / PyTorch exact | "
             "PyTorch tokens = dlm's |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for b in map(int, a.timing_batches.split(",")):
        exact = speeds.get(("torch", "none", 0.0, b), {}).get("tokens_per_s")
        for mode, t in samplers(a):
            if b not in timed_batches(a, t):
                continue
            # An FP8 row beside PyTorch's bf16 sampler of the same cache.
            d, p = speeds[("dlm", mode, t, b)], speeds.get(("torch", base_mode(mode), t, b))
            dlm_cells = f"| {mode} | {t:g} | {b} | {d['tokens_per_s']:.1f} | {d['forwards'] / a.gen:.3f} |"
            vs_exact = f"{d['tokens_per_s'] / exact:.2f}x" if exact else "-"
            if p is None:  # PyTorch's timing was skipped (--budget-minutes)
                lines.append(f"{dlm_cells} - | - | - | {vs_exact} | - | - |")
                continue
            same = agree(torch_tokens[(base_mode(mode), t, b)], gens[(mode, t)][:b])
            lines.append(f"{dlm_cells} {p['tokens_per_s']:.1f} | {p['forwards'] / a.gen:.3f} | "
                         f"{d['tokens_per_s'] / p['tokens_per_s']:.2f}x | {vs_exact} | "
                         f"{p['tokens_per_s'] / exact:.2f}x | {100 * same:.1f}% |")
    return lines


def examples(a, prompts, gens, refs):
    try:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(a.tokenizer)
    except Exception as e:  # the tables stand without the example
        return [f"(no decoded example: {e})"]
    return (["Prompt 0: " + repr(tok.decode(prompts[0]))] +
            [f"- {mode} {t:g}: " + repr(tok.decode(gens[(mode, t)][0][:80])) for mode, t in samplers(a)] +
            ["- reference: " + repr(tok.decode(refs[0][:80]))])


def main():
    a = parse_args()
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(a.out, "kvstudy.log")
    t_start = time.time()
    prompts = [list(map(int, line.split())) for line in open(a.prompts)][:a.prompt_count]
    refs = [list(map(int, line.split()))[:a.gen] for line in open(a.references)][:a.prompt_count]
    res = dict(args=vars(a))

    def save(**parts):  # after each stage: what was measured survives a later failure
        res.update({k: {"/".join(map(str, key)) if isinstance(key, tuple) else key: v for key, v in d.items()}
                    for k, d in parts.items()})
        json.dump(res, open(os.path.join(a.out, "kvstudy.json"), "w"))

    ckpt, res["train"] = train(a, log)
    losses = res["train"]["losses"]
    print(f"== trained {a.shape} in {res['train']['seconds']:.0f} s; loss {losses[-3:]}", flush=True)
    hf = os.path.join(a.work, "hf")
    sh([os.path.join(a.bin, "dlm-ckpt"), "convert", "--from", "native", "--to", "hf", "--dtype", "fp32", ckpt, hf],
       log, timeout=300)
    gens, speeds, torch_tokens = {}, {}, {}
    for mode, t in samplers(a):
        gens[(mode, t)], _ = dlm_generate(a, ckpt, prompts, mode, t, log)
        for b in timed_batches(a, t):
            _, speeds[("dlm", mode, t, b)] = dlm_generate(a, ckpt, prompts[:b], mode, t, log, speed=True)
        print(f"== dlm {mode} {t:g}: {[speeds[('dlm', mode, t, b)]['tokens_per_s'] for b in timed_batches(a, t)]} "
              "tokens/s", flush=True)
        save(generated=gens, speeds=speeds)
    dev = a.device
    model, c = load_export(hf, dev, torch.bfloat16 if dev == "cuda" else torch.float32)
    scores = {k: score(a, model, prompts, v, dev) for k, v in gens.items()}
    scores["reference"] = score(a, model, prompts, refs, dev)
    save(scores=scores)
    last = losses[-1] if losses else "-"
    head = [f"Model: {a.shape} trained {res['train']['seconds']:.0f} s by dlm-train --device {a.device} (last logged "
            f"(iteration, loss) {last}); {len(prompts)} held-out prompts of {len(prompts[0])} tokens, {a.gen} new "
            f"tokens, {a.gen} steps, block {a.block}, greedy; PyTorch {'compiled' if a.torch_compile else 'eager'}.",
            "", *quality_table(a, gens, scores, refs, speeds), ""]
    print("\n".join(head), flush=True)
    # PyTorch's timing comes last: when the run nears --budget-minutes, the rest of it is skipped, so the
    # quality table and dlm's speeds are never lost to the device call's limit.
    deadline = t_start + 60 * a.budget_minutes
    for mode, t in samplers(a):
        for b in timed_batches(a, t):
            if mode != base_mode(mode):  # an FP8 row: timed beside PyTorch's bf16 row of its cache
                continue
            if time.time() > deadline:
                print(f"== torch {mode} {t:g} batch {b}: skipped (--budget-minutes {a.budget_minutes})", flush=True)
                continue
            torch_tokens[(mode, t, b)], speeds[("torch", mode, t, b)] = torch_sample(a, model, c, prompts[:b], mode,
                                                                                     t, dev)
            print(f"== torch {mode} {t:g} batch {b}: {speeds[('torch', mode, t, b)]['tokens_per_s']:.1f} tokens/s",
                  flush=True)
    save(speeds=speeds)
    lines = [*head, *speed_table(a, speeds, gens, torch_tokens), "", *examples(a, prompts, gens, refs), "",
             f"study wall time {time.time() - t_start:.0f} s."]
    text = "\n".join(lines)
    print("\n".join(lines[len(head):]))
    open(os.path.join(a.out, "kvstudy.md"), "w").write(text + "\n")


if __name__ == "__main__":
    main()
