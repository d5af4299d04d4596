"""PyTorch reference of dlm's model and masked-diffusion objective, for the GPU comparison (compare.py).

The model is Llama/Qwen3-shaped as dlm's ModelConfig describes it (RMSNorm, fused QKV with rows grouped per KV
group, optional QK-norm, RoPE, SwiGLU, no biases, untied output layer); the loss is MegaDLMs' difflm-noshift
(per sequence t ~ U(0,1), masked = u < t with at least one position, weight masked / p_mask, mean over
positions), trained the way a PyTorch user would: torch.compile, SDPA, bf16 autocast over fp32 parameters,
fused AdamW, global-norm clipping at 1.0.

FLOPs per token (PaLM's rule): 6 x parameters other than the input embedding, plus attention
12 x layers x seq x heads x head_dim (bidirectional: every query sees every key); MFU against 989 TFLOP/s.

The sampler is MegaDLMs' generate (the same as LLaDA's): no cache, greedy x0, low-confidence remasking with
its float64 softmax, per-row top-k, blocks left to right; with --kv-cache prefix|dual (and/or --threshold) it is
generate_cached, Fast-dLLM's block KV cache and parallel decoding written the same way (dlm's --kv-cache).

usage: torch_reference.py train --config qwen3-1.7b [--steps 20 --warmup 5 --accumulate 8 --no-compile
                              --float8 tensorwise|rowwise]
       torch_reference.py sample --config megadlm-1.7b --batch 1 [--gen 256 --sample-steps 256 --block 32
                              --kv-cache none|prefix|dual --cache-refresh N --threshold T --tokens]
                              [--batches 1,16 --thresholds 0,0.9: one line per pair, one compiled model for all]
Each run prints one JSON line last (tokens_per_s, mfu, peak_gib, ...), which compare.py reads; sample prints one per
(batch, threshold).
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

PEAK_TFLOPS = 989.0

CONFIGS = {
    # name: layers, hidden, heads, kv heads, head dim, ffn, vocab, qk-norm, seq, micro-batch
    "350m": dict(layers=24, hidden=1024, heads=16, groups=8, head_dim=64, ffn=2816, vocab=50304, qk_norm=True,
                 seq=2048, batch=8),
    "qwen3-1.7b": dict(layers=28, hidden=2048, heads=16, groups=8, head_dim=128, ffn=6144, vocab=151936,
                       qk_norm=True, seq=2048, batch=4),
    "megadlm-1.7b": dict(layers=28, hidden=2048, heads=16, groups=16, head_dim=128, ffn=6144, vocab=50304,
                         qk_norm=True, seq=2048, batch=4),
    "tiny": dict(layers=2, hidden=64, heads=4, groups=2, head_dim=16, ffn=172, vocab=256, qk_norm=True, seq=32,
                 batch=2),
    # A fine-grained mixture of experts that fits one GPU with its optimizer state: every layer's MLP is 32
    # experts of FFN 1024, top-4 (softmax router, norm_topk_prob, Megatron's aux loss 1e-2) and one shared expert
    # of FFN 1024; 2.85B parameters, 0.63B active ones besides the input embedding. dlm's cuda_train_bench has the
    # same configuration.
    "moe-2.9b": dict(layers=12, hidden=2048, heads=16, groups=8, head_dim=128, ffn=1024, vocab=50304, qk_norm=True,
                     seq=2048, batch=4, experts=32, topk=4, moe_ffn=1024, shared=1024, aux_coeff=1e-2),
    "moe-tiny": dict(layers=2, hidden=64, heads=4, groups=2, head_dim=16, ffn=64, vocab=256, qk_norm=True, seq=32,
                     batch=2, experts=8, topk=2, moe_ffn=64, shared=32, aux_coeff=1e-2),
}


def model_flops_per_token(c, seq, causal=False):
    """6 x (parameters but the input embedding) + attention, per token of a training step."""
    d, hd = c["hidden"], c["head_dim"]
    q, kv = c["heads"] * hd, c["groups"] * hd
    # An MoE layer counts its active parameters: the router, k experts and the shared expert.
    moe = d * c["experts"] + 3 * d * (c["topk"] * c["moe_ffn"] + c["shared"]) if c.get("experts") else 0
    mlp = moe if c.get("experts") else 3 * d * c["ffn"]
    per_layer = d * (q + 2 * kv) + q * d + mlp + 2 * d + (2 * hd if c["qk_norm"] else 0)
    params = c["layers"] * per_layer + d + c["vocab"] * d
    attention = 12 * c["layers"] * seq * q * (0.5 if causal else 1.0)
    return 6 * params + attention


def rope_tables(seq, head_dim, base, device):
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def rope(x, cos, sin):
    """Rotate-half RoPE (HF / megatron-core's non-interleaved form); x: [B, S, heads, head_dim]."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h].float(), x[..., h:].float()
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


class MoeMlp(torch.nn.Module):
    """dlm's MoE MLP (docs/moe.md) written as a PyTorch user would with grouped GEMMs (torchtitan's form): softmax
    router, top-k, renormalised weights; the token copies sorted by expert (a stable argsort), each expert's rows
    through torch._grouped_mm (one launch per GEMM), the weighted rows summed back; a shared expert (a dense
    SwiGLU every token runs) added; Megatron's switch aux loss."""

    def __init__(self, c):
        super().__init__()
        d, e, f = c["hidden"], c["experts"], c["moe_ffn"]
        self.e, self.k, self.coeff = e, c["topk"], c["aux_coeff"]
        self.router = torch.nn.Linear(d, e, bias=False)
        self.w1 = torch.nn.Parameter(torch.empty(e, 2 * f, d))  # rows [gate | up], as dlm's experts.linear_fc1
        self.w2 = torch.nn.Parameter(torch.empty(e, d, f))
        self.shared = None
        if c["shared"]:
            self.shared = torch.nn.Sequential(torch.nn.Linear(d, 2 * c["shared"], bias=False),
                                              torch.nn.Linear(c["shared"], d, bias=False))

    def forward(self, h):
        shape = h.shape
        x = h.reshape(-1, shape[-1]).to(torch.bfloat16)
        n = x.shape[0]
        probs = torch.softmax(self.router(x).float(), dim=-1)
        w, idx = torch.topk(probs, self.k, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        flat = idx.flatten()
        counts = torch.zeros(self.e, dtype=torch.int32, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        order = torch.argsort(flat, stable=True)
        token = order // self.k
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        gu = torch._grouped_mm(x[token], self.w1.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        gate, up = gu.chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, self.w2.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        y = y * w.flatten()[order].unsqueeze(-1).to(y.dtype)
        out = torch.zeros_like(x).index_add_(0, token, y)
        if self.shared is not None:
            gate, up = self.shared[0](x).chunk(2, dim=-1)
            out = out + self.shared[1](F.silu(gate) * up)
        aux = self.coeff * self.e / (self.k * n * n) * (counts.float() * probs.sum(dim=0)).sum()
        return out.view(shape), aux


class Block(torch.nn.Module):
    def __init__(self, c, causal):
        super().__init__()
        d, hd = c["hidden"], c["head_dim"]
        self.h, self.g, self.hd, self.causal = c["heads"], c["groups"], hd, causal
        self.ln1 = torch.nn.Parameter(torch.ones(d))
        self.qkv = torch.nn.Linear(d, (self.h + 2 * self.g) * hd, bias=False)
        self.qn = torch.nn.Parameter(torch.ones(hd)) if c["qk_norm"] else None
        self.kn = torch.nn.Parameter(torch.ones(hd)) if c["qk_norm"] else None
        self.proj = torch.nn.Linear(self.h * hd, d, bias=False)
        self.ln2 = torch.nn.Parameter(torch.ones(d))
        self.moe = MoeMlp(c) if c.get("experts") else None
        if self.moe is None:
            self.fc1 = torch.nn.Linear(d, 2 * c["ffn"], bias=False)
            self.fc2 = torch.nn.Linear(c["ffn"], d, bias=False)

    def mlp(self, h):
        """The MLP's output and its router's aux loss (0 for a dense layer)."""
        if self.moe is not None:
            return self.moe(h)
        gate, up = self.fc1(h).chunk(2, dim=-1)
        return self.fc2(F.silu(gate) * up), 0.0

    def forward_kv(self, x, cos, sin, before=None, after=None):
        """The layer, its keys (after QK-norm and RoPE) and values [B, S, G, D], and its MLP's aux loss. With the block cache
        (generate_cached), x holds a window of columns whose queries also attend to the stored keys/values of
        the columns before (`before`) and after (`after`) it: (k, v) pairs, or None."""
        b, s, _ = x.shape
        per = self.h // self.g
        qkv = self.qkv(F.rms_norm(x, (x.shape[-1],), self.ln1, 1e-6)).view(b, s, self.g, per + 2, self.hd)
        q = qkv[:, :, :, :per].reshape(b, s, self.h, self.hd)
        k, v = qkv[:, :, :, per], qkv[:, :, :, per + 1]
        if self.qn is not None:
            q = F.rms_norm(q, (self.hd,), self.qn, 1e-6)
            k = F.rms_norm(k, (self.hd,), self.kn, 1e-6)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        keys = torch.cat([t for t in (before and before[0], k, after and after[0]) if t is not None], dim=1)
        values = torch.cat([t for t in (before and before[1], v, after and after[1]) if t is not None], dim=1)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                           is_causal=self.causal, enable_gqa=self.g != self.h)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, self.h * self.hd))
        y, aux = self.mlp(F.rms_norm(x, (x.shape[-1],), self.ln2, 1e-6))
        return x + y, k, v, aux


class Model(torch.nn.Module):
    def __init__(self, c, causal=False):
        super().__init__()
        self.c = c
        self.emb = torch.nn.Embedding(c["vocab"], c["hidden"])
        self.layers = torch.nn.ModuleList(Block(c, causal) for _ in range(c["layers"]))
        self.ln_f = torch.nn.Parameter(torch.ones(c["hidden"]))
        self.out = torch.nn.Linear(c["hidden"], c["vocab"], bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        return self.forward_aux(ids)[0]

    def forward_aux(self, ids):
        """Logits and the sum of the MoE layers' aux losses (0 for a dense model)."""
        cos, sin = rope_tables(ids.shape[1], self.c["head_dim"], 10000.0, ids.device)
        x, aux = self.emb(ids), 0.0
        for layer in self.layers:
            x, _, _, a = layer.forward_kv(x, cos, sin)
            aux = aux + a
        return self.out(F.rms_norm(x, (x.shape[-1],), self.ln_f, 1e-6)), aux

    def compile_layers(self):
        """forward_kv's layers under torch.compile as one function with dynamic shapes (regional compilation): the
        layers share its graphs (their parameters are its inputs), and a window's width and the stored keys' split,
        which change with every block, need no recompilation; a batch of one is specialised. Compiling the whole
        forward_kv instead traces 28 layers per shape, minutes at the 1.7B shape."""
        self.layer_kv = torch.compile(Block.forward_kv, dynamic=True)

    def forward_kv(self, ids, cos, sin, before=None, after=None):
        """Logits of ids (a window of columns at RoPE tables cos, sin) and every layer's (k, v); before/after:
        per layer the stored (k, v) of the columns around the window (Block.forward_kv), or None."""
        x, kv = self.emb(ids), []
        layer_kv = getattr(self, "layer_kv", Block.forward_kv)
        for i, layer in enumerate(self.layers):
            x, k, v, _ = layer_kv(layer, x, cos, sin, before and before[i], after and after[i])
            kv.append((k, v))
        return self.out(F.rms_norm(x, (x.shape[-1],), self.ln_f, 1e-6)), kv


def diffusion_loss(model, tokens, mask_id):
    """MegaDLMs' difflm-noshift loss on a batch of clean sequences (loss mask all ones), plus the MoE aux losses."""
    b, l = tokens.shape
    t = torch.rand(b, 1, device=tokens.device)
    masked = torch.rand(b, l, device=tokens.device) < t
    none = ~masked.any(dim=1)
    forced = torch.randint(0, l, (b,), device=tokens.device)
    masked[torch.arange(b, device=tokens.device), forced] |= none
    p_mask = masked.float().mean(dim=1, keepdim=True)
    logits, aux = model.forward_aux(torch.where(masked, torch.full_like(tokens, mask_id), tokens))
    ce = F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten(), reduction="none").view(b, l)
    return (ce * masked / p_mask).sum() / (b * l) + aux


def train(args):
    c = dict(CONFIGS[args.config])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    b, s = args.batch or c["batch"], args.seq or c["seq"]
    torch.manual_seed(0)
    model = Model(c).to(dev)
    if args.float8 != "none":
        # torchao's float8 training on the blocks' linear layers (the output layer, like dlm's, stays bf16), swapped
        # before torch.compile as torchao's examples do.
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "out",
                                   config=Float8LinearConfig.from_recipe_name(args.float8))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev == "cuda")
    loss_fn = torch.compile(diffusion_loss) if args.compile else diffusion_loss
    n = args.accumulate
    tokens = torch.randint(0, c["vocab"] - 1, (args.steps + args.warmup, n, b, s), device=dev)

    def step(i):
        # n micro-batches' gradients (each loss / n: the step's mean), then one clipped AdamW step.
        total = 0.0
        for m in range(n):
            with torch.autocast(dev, dtype=torch.bfloat16):
                loss = loss_fn(model, tokens[i, m], c["vocab"] - 1) / n
            loss.backward()
            total = total + loss.detach()
        loss = total
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(args.warmup):
        step(i)
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    losses = [step(args.warmup + i).detach() for i in range(args.steps)]
    if dev == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.steps
    tps = b * s * n / dt
    flops = model_flops_per_token(c, s)
    out = dict(peer="torch", mode="train", config=args.config, batch=b, seq=s, accumulate=n, compile=args.compile,
               float8=args.float8, step_ms=dt * 1e3, tokens_per_s=tps, mfu=tps * flops / (PEAK_TFLOPS * 1e12),
               loss=float(losses[-1]), flops_per_token=flops,
               peak_gib=torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else 0.0)
    print(json.dumps(out), flush=True)


@torch.no_grad()
def generate(model, prompt, gen, steps, block, mask_id):
    """MegaDLMs' generate: greedy x0, low-confidence remasking (float64 softmax), per-row top-k."""
    b = prompt.shape[0]
    x = torch.cat([prompt, torch.full((b, gen), mask_id, dtype=prompt.dtype, device=prompt.device)], dim=1)
    p_len, blocks = prompt.shape[1], gen // block
    per_block = steps // blocks
    for blk in range(blocks):
        lo, hi = p_len + blk * block, p_len + (blk + 1) * block
        n = (x[:, lo:hi] == mask_id).sum(dim=1, keepdim=True)
        counts = (n // per_block).repeat(1, per_block)
        counts += torch.arange(per_block, device=x.device)[None, :] < (n % per_block)
        for i in range(per_block):
            is_mask = x == mask_id
            logits = model(x)
            x0 = logits.argmax(dim=-1)
            conf = torch.gather(torch.softmax(logits.double(), dim=-1), -1, x0[..., None]).squeeze(-1)
            conf[:, hi:] = -math.inf
            x0 = torch.where(is_mask, x0, x)
            conf = torch.where(is_mask, conf, torch.full_like(conf, -math.inf))
            transfer = torch.zeros_like(is_mask)
            for r in range(b):
                _, idx = torch.topk(conf[r], k=int(counts[r, i]))
                transfer[r, idx] = True
            x = torch.where(transfer, x0, x)
    return x


@torch.no_grad()
def generate_cached(fwd, prompt, gen, steps, block, mask_id, head_dim, mode, refresh=0, threshold=0.0):
    """generate with Fast-dLLM's block KV cache (dlm's --kv-cache, docs/generation.md) and its parallel decoding.

    fwd: Model.forward_kv (compiled or not). In block [lo, hi), step i: a full forward when i % refresh == 0
    (refresh 0: i == 0 only), which stores every layer's keys and values; otherwise only the window
    [lo, L) (prefix) or [lo, hi) (dual) runs, attending to the stored keys/values around it. mode "none": a
    full forward every step. threshold > 0: every masked position above it is unmasked (the most confident
    at least) until the block has none, in at most K steps. The prompt holds no mask. Returns x and the number
    of forwards."""
    b = prompt.shape[0]
    x = torch.cat([prompt, torch.full((b, gen), mask_id, dtype=prompt.dtype, device=prompt.device)], dim=1)
    length, p_len, blocks = x.shape[1], prompt.shape[1], gen // block
    cos, sin = rope_tables(length, head_dim, 10000.0, x.device)
    per_block, calls, kv = steps // blocks, 0, None
    rows = torch.arange(b, device=x.device)
    for blk in range(blocks):
        lo, hi = p_len + blk * block, p_len + (blk + 1) * block
        end = hi if mode == "dual" else length
        n = (x[:, lo:hi] == mask_id).sum(dim=1, keepdim=True)
        counts = (n // per_block).repeat(1, per_block)
        counts += torch.arange(per_block, device=x.device)[None, :] < (n % per_block)
        i = 0
        # Parallel decoding stops at K steps as dlm's sampler does: a model that predicts the mask id itself
        # leaves a position masked after its step, and the block would never empty.
        while (i < per_block) if threshold <= 0 else (i < block and bool((x[:, lo:hi] == mask_id).any())):
            if mode == "none" or i == 0 or (refresh > 0 and i % refresh == 0):
                logits, kv = fwd(x, cos, sin)
                first = 0
            else:
                before = [(k[:, :lo], v[:, :lo]) for k, v in kv]
                after = [(k[:, end:], v[:, end:]) for k, v in kv] if end < length else None
                logits, _ = fwd(x[:, lo:end], cos[lo:end], sin[lo:end], before, after)
                first = lo
            calls += 1
            cols = x[:, first:hi]
            logits = logits[:, : hi - first]
            is_mask = cols == mask_id
            x0 = logits.argmax(dim=-1)
            conf = torch.gather(torch.softmax(logits.double(), dim=-1), -1, x0[..., None]).squeeze(-1)
            conf = torch.where(is_mask, conf, torch.full_like(conf, -math.inf))
            if threshold > 0:
                transfer = is_mask & (conf > threshold)
                best = conf.argmax(dim=1)
                transfer[rows, best] |= is_mask[rows, best]
            else:
                transfer = torch.zeros_like(is_mask)
                for r in range(b):
                    _, idx = torch.topk(conf[r], k=int(counts[r, i]))
                    transfer[r, idx] = True
            x[:, first:hi] = torch.where(transfer, x0, cols)
            i += 1
    return x, calls


def sample(args):
    """One JSON line per (batch, threshold) of --batches x --thresholds, all with one compiled model: the exact
    sampler (--kv-cache none at threshold 0) compiles per batch (its one shape, [batch, prompt + gen]); the cached
    sampler's layers are compiled once with dynamic shapes (Model.compile_layers), because a window's width and the
    stored keys' split change with every block: its few graphs (the full forward, the window with and without keys
    after it; a batch of one is specialised) serve every layer, block and batch."""
    c = dict(CONFIGS[args.config])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = Model(c).to(dev).to(torch.bfloat16).eval()
    mask_id = c["vocab"] - 1
    batches = [int(v) for v in args.batches.split(",")] if args.batches else [args.batch]
    thresholds = [float(v) for v in args.thresholds.split(",")] if args.thresholds else [args.threshold]
    if args.compile:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    full = torch.compile(model, dynamic=False) if args.compile else model  # static per batch, as one batch a process
    if args.compile:
        model.compile_layers()
    cached = model.forward_kv
    for batch in batches:
        prompt = torch.randint(0, c["vocab"] - 1, (batch, args.prompt), generator=torch.Generator().manual_seed(batch))
        prompt = prompt.to(dev)
        for threshold in thresholds:
            calls = args.sample_steps
            if args.kv_cache == "none" and threshold <= 0:
                run = lambda steps: generate(full, prompt, args.gen, steps, args.block, mask_id)  # noqa: E731
            else:
                def run(steps):
                    nonlocal calls
                    x, calls = generate_cached(cached, prompt, args.gen, steps, args.block, mask_id, c["head_dim"],
                                               args.kv_cache, args.cache_refresh, threshold)
                    return x
            # Warm-up / compile at the timed run's shapes (prompt + gen columns), two steps per block (a full forward
            # and a window under the cache): a warm-up at another length left torch.compile recompiling inside the
            # timed region. Twice: a dynamic-shape recompilation (a size first seen as static) lands in the first.
            t0 = time.perf_counter()
            run(2 * (args.gen // args.block))
            run(2 * (args.gen // args.block))
            if dev == "cuda":
                torch.cuda.synchronize()
            warm = time.perf_counter() - t0
            t0 = time.perf_counter()
            x = run(args.sample_steps)
            if dev == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            out = dict(peer="torch", mode="sample", config=args.config, batch=batch, compile=args.compile,
                       prompt=args.prompt, gen=args.gen, steps=args.sample_steps, block=args.block,
                       kv_cache=args.kv_cache, cache_refresh=args.cache_refresh, threshold=threshold, forwards=calls,
                       seconds=dt, tokens_per_s=batch * args.gen / dt, warmup_seconds=warm,
                       first=int(x[0, args.prompt]))
            if args.tokens:
                out["tokens"] = x[:, args.prompt:].tolist()
            print(json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "sample"])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="350m")
    ap.add_argument("--batch", type=int, default=0, help="micro-batch (train) or prompts (sample); 0 = config's")
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10, help="timed training steps")
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step (train)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--float8", choices=["none", "tensorwise", "rowwise"], default="none",
                    help="train: torchao float8 training of the blocks' linear layers (torchao on PYTHONPATH)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--sample-steps", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--kv-cache", choices=["none", "prefix", "dual"], default="none",
                    help="sample: Fast-dLLM's block KV cache (generate_cached); none with --threshold 0 is generate")
    ap.add_argument("--cache-refresh", type=int, default=0, help="sample: a full forward every N steps of a block")
    ap.add_argument("--threshold", type=float, default=0.0, help="sample: parallel decoding above this confidence")
    ap.add_argument("--batches", default="", help="sample: comma-separated batches, one line each (default --batch)")
    ap.add_argument("--thresholds", default="", help="sample: comma-separated thresholds, one line each "
                    "(default --threshold)")
    ap.add_argument("--tokens", action="store_true", help="sample: print the generated tokens too")
    args = ap.parse_args()
    if args.mode == "sample" and args.batch == 0:
        args.batch = 1
    train(args) if args.mode == "train" else sample(args)


if __name__ == "__main__":
    main()
