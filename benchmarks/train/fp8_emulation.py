"""FP8 training's numerics emulated on the CPU, independently of dlm's CUDA code: the tiny model and the training of
tests/gpu/cuda_fp8_model_test.cpp (TinyModelFollowsItsBf16Losses) in PyTorch (torch_reference.Model), with the QKV,
projection, fc1 and fc2 linear layers replaced by an autograd Function that does the recipe of
include/dlm/train/fp8.h, as Transformer Engine / Megatron define it:

  scale = fp8_max / amax * 2^-margin (fp32; an amax of 0 or not finite keeps the previous scale, one that overflows
          fp32 gives FLT_MAX); tensorwise: amax = max|tensor| of the tensor being cast; delayed: the slot's scale,
          updated at each forward from its amax history (max of the window, or its most recent entry), every cast
          recording its tensor's amax for the next update (scales start at 1).
  cast  = saturating round-to-nearest-even of x * scale to e4m3 (X and W in the forward; dY under `e4m3`) or e5m2
          (dY under `hybrid`); the GEMMs multiply the dequantized values in fp32:
          y = X W^T (bf16 out), dX = dY W (bf16 out), dW = dY^T X (fp32).

The rest follows dlm's CudaModel where it matters to the question: the initial weights are dlm's (Model::init's
Philox draw, so seed 31 is the GPU test's model), the batches are the test's (std::mt19937 seeded 8: counting rows mod
64, half the positions masked, weights 1 / masked count, loss = sum of weight x cross-entropy over the 500-token
vocabulary of the 512 padded logits), AdamW (0.9, 0.999, 1e-8, weight decay 0.01 but on norms) at lr 3e-3 with
Megatron's clipping at 1.0, and the last layer's MLP run on the loss rows only (padded by copies of row 0 to a
multiple of 128 when that is fewer rows: Impl::loss_rows_mlp), which is the row set its fc1 / fc2 amaxes see.
The bf16 reference is PyTorch's bf16 autocast over fp32 master weights (the linear layers' operands rounded to bf16,
fp32 accumulation, bf16 outputs); fp32 is printed beside it as the floor of what precision alone moves.

usage: fp8_emulation.py [--steps 40] [--seeds 31] [--data-seeds 8] [--recipes all] [--width 128]
Prints per run the first and last losses and the mean of the last ten (the test's statistic), and per recipe the
mean and spread over the seeds of (recipe - bf16) in that statistic.
--sampling-forward: instead, FP8 sampling's forward (dlm-generate --fp8: tensorwise e4m3 at any row count, the output
layer included) against
bf16's on tests/gpu/cuda_fp8_sampling_test.cpp's model (seed 41, init std 0.05, FFN 384) and inputs (std::mt19937
seeded 1, ids below 499, shape after shape): the logits' relative L2 error per shape, the bound that test derives.
"""
import argparse
import math
import os
import statistics
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402

E4M3, E5M2 = (torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)
FLT_MAX = float(np.finfo(np.float32).max)
MASK_ID, VOCAB, PADDED_VOCAB, HEAD_ROW_QUANTUM = 499, 500, 512, 128
# --defect: a bug injected on purpose, to see what the GPU tests' bounds would catch. dy-scale-inv: the backward
# GEMMs multiply dY by X's scale_inv instead of its own; dy-e4m3-max: dY's scale uses e4m3's 448 under hybrid.
DEFECTS = ["none", "dy-scale-inv", "dy-e4m3-max"]
DEFECT = "none"


class Recipe:
    def __init__(self, name, fp8=True, grads=E5M2, delayed=False, history=1, algo_max=False, margin=0,
                 current_grads=False, any_rows=False):
        self.name, self.fp8, self.grads, self.delayed = name, fp8, grads, delayed
        self.any_rows = any_rows  # FP8 at any row count (sampling), not only multiples of 16 (training)
        self.current_grads = current_grads  # delayed, but dY cast from its own amax (emulated only: not a dlm recipe)
        self.history, self.algo_max, self.margin_factor = history, algo_max, 2.0 ** -margin


# The GPU test's five recipes (Megatron's defaults: hybrid, delayed, history 1, most_recent), then more.
RECIPES = {
    "fp32": Recipe("fp32", fp8=False),
    "bf16": Recipe("bf16", fp8=False),
    "delayed": Recipe("delayed", delayed=True),
    "delayed-h16-max": Recipe("delayed-h16-max", delayed=True, history=16, algo_max=True),
    "tensorwise": Recipe("tensorwise"),
    "tensorwise-e4m3": Recipe("tensorwise-e4m3", grads=E4M3),
    "tensorwise-margin2": Recipe("tensorwise-margin2", margin=2),
    "delayed-h1024-max": Recipe("delayed-h1024-max", delayed=True, history=1024, algo_max=True),
    "delayed-e4m3": Recipe("delayed-e4m3", grads=E4M3, delayed=True),
    "delayed-cg": Recipe("delayed-cg", delayed=True, current_grads=True),
}
SAMPLING = Recipe("sampling", grads=E4M3, any_rows=True)  # Fp8Linears' forward-only use
LLADA = False  # --llada: the batches' weights as dlm's llada objective gives them (1 / p per sequence)
SATURATED = {}  # recipe name -> [dY elements cast beyond the format's max, dY elements cast]


# ---- dlm's initial weights: Model::init (libtrain/model/model.cpp), Philox4x32-10 + Box-Muller in double ----

def philox4x32(c, key):
    """Random123's philox4x32_10 on arrays of counters (uint64 arrays holding 32-bit words)."""
    c = [x.astype(np.uint64) for x in c]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    m32 = np.uint64(0xFFFFFFFF)
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ k0) & m32, p1 & m32, ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & m32, p0 & m32]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m32, (k1 + np.uint64(0xBB67AE85)) & m32
    return c


def counter_uniform(seed, domain, index, sub):
    """CounterRng::uniform: [0, 1) from 53 bits of the first two words."""
    n = len(sub)
    b = philox4x32([np.full(n, index & 0xFFFFFFFF), np.full(n, index >> 32), sub, np.full(n, domain)],
                   (seed & 0xFFFFFFFF, seed >> 32))
    return ((b[0] >> np.uint64(5)).astype(np.float64) * 67108864.0 + (b[1] >> np.uint64(6)).astype(np.float64)) \
        / 9007199254740992.0


def dlm_normal(seed, tensor_index, numel, std):
    init = 0x494E4954  # "INIT"
    pairs = np.arange((numel + 1) // 2, dtype=np.uint64)
    u1 = 1.0 - counter_uniform(seed, init, tensor_index, pairs)
    u2 = counter_uniform(seed, init + 1, tensor_index, pairs)
    radius = std * np.sqrt(-2.0 * np.log(u1))
    out = np.empty(pairs.size * 2)
    out[0::2], out[1::2] = radius * np.cos(2 * math.pi * u2), radius * np.sin(2 * math.pi * u2)
    return out[:numel].astype(np.float32)


def dlm_tensor_names(layers):
    """model_tensors(config) of a dense QK-norm model, in order, with the reference model's attribute paths."""
    names = [("embedding.word_embeddings.weight", "emb.weight")]
    for i in range(layers):
        p, q = f"decoder.layers.{i}.", f"layers.{i}."
        names += [(p + "self_attention.linear_qkv.layer_norm_weight", q + "ln1"),
                  (p + "self_attention.linear_qkv.weight", q + "qkv.weight"),
                  (p + "self_attention.q_layernorm.weight", q + "qn"),
                  (p + "self_attention.k_layernorm.weight", q + "kn"),
                  (p + "self_attention.linear_proj.weight", q + "proj.weight"),
                  (p + "mlp.linear_fc1.layer_norm_weight", q + "ln2"),
                  (p + "mlp.linear_fc1.weight", q + "fc1.weight"),
                  (p + "mlp.linear_fc2.weight", q + "fc2.weight")]
    return names + [("decoder.final_layernorm.weight", "ln_f"), ("output_layer.weight", "out.weight")]


def load_dlm_init(model, layers, seed, std=0.02):
    params = dict(model.named_parameters())
    with torch.no_grad():
        for t, (_, attr) in enumerate(dlm_tensor_names(layers)):
            p = params[attr]
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.from_numpy(dlm_normal(seed, t, p.numel(), std)).view_as(p))


# ---- the test's batches: std::mt19937 ----

class MT19937:
    def __init__(self, seed):
        self.mt, self.i = [seed & 0xFFFFFFFF], 624
        for k in range(1, 624):
            self.mt.append((1812433253 * (self.mt[-1] ^ (self.mt[-1] >> 30)) + k) & 0xFFFFFFFF)

    def __call__(self):
        if self.i >= 624:
            mt = self.mt
            for k in range(624):
                y = (mt[k] & 0x80000000) | (mt[(k + 1) % 624] & 0x7FFFFFFF)
                mt[k] = mt[(k + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)


def counting_rows(rng, batch, seq):
    """cuda_fp8_model_test.cpp's counting_rows: ids, labels [batch, seq] and weights (1 / masked count)."""
    ids, labels, masked = [], [], []
    for _ in range(batch):
        start = rng() % 64
        for j in range(seq):
            labels.append((start + j) % 64)
            masked.append(rng() % 2 == 0)
            ids.append(MASK_ID if masked[-1] else labels[-1])
    m = torch.tensor(masked, dtype=torch.float32)
    shape = (batch, seq)
    if LLADA:
        # objective/masked_diffusion.cpp's llada: p ~ U(eps, 1) per sequence, a position masked with probability p,
        # weighted 1 / (p batch seq).
        ids, masked, weights = [], [], []
        for b in range(batch):
            p = (1 - 1e-3) * (rng() / 2.0 ** 32) + 1e-3
            for j in range(seq):
                mk = rng() / 2.0 ** 32 < p
                ids.append(MASK_ID if mk else labels[b * seq + j])
                weights.append(1.0 / (p * batch * seq) if mk else 0.0)
        return torch.tensor(ids).view(shape), torch.tensor(labels).view(shape), torch.tensor(weights).view(shape)
    return torch.tensor(ids).view(shape), torch.tensor(labels).view(shape), (m / m.sum()).view(shape)


# ---- the recipe ----

def fp8_scale(amax, fp8_max, margin_factor, previous):
    """dlm/train/fp8.h's fp8_scale in fp32."""
    if not (amax > 0.0 and math.isfinite(amax)):
        return previous
    s = float(np.float32(np.float32(fp8_max) / np.float32(amax)) * np.float32(margin_factor))
    return s if s <= FLT_MAX else FLT_MAX


class Slot:
    """One FP8 tensor's scaling state: the scale, the interval's amax, the history (most recent first)."""

    def __init__(self, fmt, recipe, grad=False):
        self.fmt, self.recipe, self.grad = fmt, recipe, grad
        self.current = not recipe.delayed or (grad and recipe.current_grads)
        self.scale, self.amax, self.history = 1.0, 0.0, [0.0] * recipe.history

    def update(self):
        self.history = [self.amax] + self.history[:-1]
        amax = max(self.history) if self.recipe.algo_max else self.history[0]
        self.scale = fp8_scale(amax, self.fmt[1], self.recipe.margin_factor, self.scale)
        self.amax = 0.0

    def cast(self, x):
        """x (fp32 holding bf16 values) cast with this slot: the dequantized values the GEMM sees."""
        q, scale_inv = self.quantize(x)
        return q * scale_inv

    def quantize(self, x):
        """The FP8 values (as fp32) and the scale_inv a GEMM multiplies them by (amax recorded as cast() does)."""
        amax = float(x.abs().max())
        if not self.current:
            self.amax = max(self.amax, amax)
        else:
            self.scale = fp8_scale(amax, self.fmt[1], self.recipe.margin_factor, self.scale)
        scale = np.float32(self.scale)
        dtype, fmax = self.fmt
        if self.grad:
            sat = SATURATED.setdefault(self.recipe.name, [0, 0])
            sat[0] += int((x.abs() * float(scale) > fmax).sum())
            sat[1] += x.numel()
        q = (x * torch.tensor(scale)).clamp(-fmax, fmax).to(dtype).to(torch.float32)
        return q, torch.tensor(np.float32(1.0) / scale)


class LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, layer):
        with torch.autocast("cpu", enabled=False):
            shape = x.shape
            xb = x.reshape(-1, shape[-1]).to(torch.bfloat16).float()
            wb = w.to(torch.bfloat16).float()
            fp8 = layer.recipe.fp8 and (layer.recipe.any_rows or xb.shape[0] % 16 == 0)
            if layer.recipe.fp8 or layer.recipe.name == "bf16":
                ctx.save_for_backward(xb, wb)
            else:  # fp32
                xb, wb = x.reshape(-1, shape[-1]).float(), w.float()
                ctx.save_for_backward(xb, wb)
            ctx.layer, ctx.fp8, ctx.shape = layer, fp8, shape
            if fp8:
                y = layer.x.cast(xb) @ layer.w_cast(wb).t()
            else:
                y = xb @ wb.t()
            out_dtype = torch.float32 if layer.recipe.name == "fp32" else torch.bfloat16
            return y.to(out_dtype).view(*shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        xb, wb = ctx.saved_tensors
        layer = ctx.layer
        dy = dy.reshape(-1, wb.shape[0])
        dy = dy.float() if layer.recipe.name == "fp32" else dy.to(torch.bfloat16).float()
        if ctx.fp8 and DEFECT == "dy-scale-inv":  # an injected defect: dY dequantized with X's scale_inv
            q, _ = layer.dy.quantize(dy)
            xq, x_scale_inv = layer.x.quantize(xb)
            dyq, xq, wq = q * x_scale_inv, xq * x_scale_inv, layer.w_cast(wb)
        elif ctx.fp8:
            dyq, xq, wq = layer.dy.cast(dy), layer.x.cast(xb), layer.w_cast(wb)
        else:
            dyq, xq, wq = dy, xb, wb
        dx, dw = dyq @ wq, dyq.t() @ xq
        out_dtype = torch.float32 if layer.recipe.name == "fp32" else torch.bfloat16
        return dx.to(out_dtype).view(ctx.shape), dw, None


class EmulatedLinear(torch.nn.Module):
    """A bias-free linear layer [out, in] whose GEMMs follow `recipe` (fp32, bf16 or FP8)."""

    def __init__(self, weight, recipe):
        super().__init__()
        self.weight, self.recipe = weight, recipe
        grads = (recipe.grads[0], E4M3[1]) if DEFECT == "dy-e4m3-max" else recipe.grads
        self.x, self.w, self.dy = Slot(E4M3, recipe), Slot(E4M3, recipe), Slot(grads, recipe, grad=True)
        self.w_q = None

    def begin_forward(self):
        """Fp8Linears::begin_forward: the delayed update, then the weight's cast (it changes every step)."""
        if self.recipe.delayed:
            for s in (self.x, self.w, self.dy):
                s.update()
        self.w_q = None

    def w_cast(self, wb):
        if self.w_q is None:
            self.w_q = self.w.cast(wb)
        return self.w_q

    def forward(self, x):
        return LinearFn.apply(x, self.weight, self)


def build(c, recipe, seed, std=0.02, head=False):
    """head: the output layer follows `recipe` too (FP8 sampling's, Fp8Linears' head_tensor)."""
    torch.manual_seed(0)
    model = ref.Model(c)
    load_dlm_init(model, c["layers"], seed, std)
    linears = []
    for block in model.layers:
        for name in ("qkv", "proj", "fc1", "fc2"):
            lin = EmulatedLinear(getattr(block, name).weight, recipe)
            setattr(block, name, lin)
            linears.append(lin)
    if head:
        model.out = EmulatedLinear(model.out.weight, recipe)
        linears.append(model.out)
    model.fp8_linears = linears
    return model, linears


def pack_last_mlp(block, rows, count):
    """The last layer's MLP on the loss rows (`count` of them, then padding copies of row 0): their output scattered
    back; every other row's MLP output reaches no loss and is left 0."""
    mlp = type(block).mlp.__get__(block)

    def packed(h):
        flat = h.reshape(-1, h.shape[-1])
        y, aux = mlp(flat[rows])
        out = y.new_zeros(flat.shape[0], y.shape[-1]).index_copy(0, rows[:count], y[:count])
        return out.view(*h.shape[:-1], y.shape[-1]), aux

    block.mlp = packed


def train(c, recipe, seed, data_seed, steps, lr=3e-3):
    model, _ = build(c, recipe, seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    norms = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": norms, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.999), eps=1e-8)
    rng, losses = MT19937(data_seed), []
    for _ in range(steps):
        losses.append(loss_of(model, *counting_rows(rng, 4, 64), recipe))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


def loss_of(model, ids, labels, weights, recipe):
    """One micro-batch's forward and backward (gradients added into .grad); returns the loss."""
    n = ids.numel()
    loss_rows = torch.nonzero(weights.flatten()).flatten()
    padded = -(-loss_rows.numel() // HEAD_ROW_QUANTUM) * HEAD_ROW_QUANTUM
    if padded < n:
        rows = torch.cat([loss_rows, loss_rows.new_zeros(padded - loss_rows.numel())])
        pack_last_mlp(model.layers[-1], rows, loss_rows.numel())
    else:
        model.layers[-1].__dict__.pop("mlp", None)
    for lin in model.fp8_linears:
        lin.begin_forward()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.name != "fp32"):
        logits = model(ids)
    ce = F.cross_entropy(logits.float()[..., :VOCAB].flatten(0, 1), labels.flatten(), reduction="none")
    loss = (ce * weights.flatten()).sum()
    loss.backward()
    return float(loss.detach())


def gradient_errors(c, recipe, seed, data_seed, repeats):
    """The relative L2 error ||g - g_bf16|| / ||g_bf16|| of every parameter's gradient of one micro-batch (the first
    of data_seed) at the initial weights, after `repeats` earlier forward/backward passes of the same batch (which
    fill a delayed recipe's amax history)."""
    batch = counting_rows(MT19937(data_seed), 4, 64)
    grads = []
    for r, passes in ((RECIPES["bf16"], 1), (recipe, repeats + 1)):
        model, _ = build(c, r, seed)
        for _ in range(passes):
            model.zero_grad(set_to_none=True)
            loss_of(model, *batch, r)
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    return {name: float((grads[1][name] - g).norm() / g.norm()) for name, g in grads[0].items() if g.norm() > 0}


def sampling_forward_errors(shapes, seed=41, std=0.05, ffn=384):
    """The FP8 sampling forward's logits against bf16's, relative L2, per (batch, seq) of `shapes` (ids drawn in
    turn from one std::mt19937 seeded 1, as the GPU test draws them)."""
    c = dict(layers=2, hidden=128, heads=4, groups=2, head_dim=32, ffn=ffn, vocab=PADDED_VOCAB, qk_norm=True)
    models = {r.name: build(c, r, seed, std, head=r is SAMPLING)[0] for r in (RECIPES["bf16"], SAMPLING)}
    rng, errors = MT19937(1), []
    for batch, seq in shapes:
        ids = torch.tensor([rng() % 499 for _ in range(batch * seq)]).view(batch, seq)
        logits = {}
        for name, model in models.items():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                logits[name] = model(ids).float()[..., :VOCAB]
        errors.append(float((logits["sampling"] - logits["bf16"]).norm() / logits["bf16"].norm()))
    return errors


def tail(losses):
    return sum(losses[-10:]) / 10


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", default="31", help="model init seeds, comma-separated")
    ap.add_argument("--data-seeds", default="8", help="batch seeds, comma-separated (every pair is run)")
    ap.add_argument("--recipes", default="all", help=f"comma-separated of {','.join(RECIPES)}")
    ap.add_argument("--width", type=int, default=128, help="hidden size (the test's 128); ffn 3 x width")
    ap.add_argument("--quiet", action="store_true", help="only the summary")
    ap.add_argument("--gradients", type=int, default=-1, metavar="REPEATS",
                    help="instead of training: each recipe's gradient error against bf16 on the first batch at the "
                         "initial weights, after REPEATS earlier passes of that batch (delayed scaling's history)")
    ap.add_argument("--defect", choices=DEFECTS, default="none")
    ap.add_argument("--sampling-forward", action="store_true",
                    help="instead of training: FP8 sampling's forward logits against bf16's (the sampling test's)")
    ap.add_argument("--llada", action="store_true",
                    help="batches weighted as dlm's llada objective (1 / p per sequence, p ~ U(1e-3, 1))")
    args = ap.parse_args()
    global DEFECT, LLADA
    DEFECT, LLADA = args.defect, args.llada
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    if args.sampling_forward:
        shapes = [(2, 40), (1, 37), (3, 23), (40, 128), (41, 125)]
        for (batch, seq), err in zip(shapes, sampling_forward_errors(shapes)):
            print(f"sampling forward {batch} x {seq}: FP8 logits relative error to bf16 {err:.4f}", flush=True)
        return
    w = args.width
    c = dict(layers=2, hidden=w, heads=w // 32, groups=w // 64, head_dim=32, ffn=3 * w, vocab=PADDED_VOCAB,
             qk_norm=True)
    names = list(RECIPES) if args.recipes == "all" else args.recipes.split(",")
    if "bf16" not in names:
        names.insert(0, "bf16")
    runs = [(int(s), int(d)) for s in args.seeds.split(",") for d in args.data_seeds.split(",")]
    if args.gradients >= 0:
        print(f"width {w}: relative L2 error of each gradient against bf16's (max over the runs), after "
              f"{args.gradients} earlier pass(es); defect {DEFECT}")
        for n in names:
            worst = {}
            for seed, data_seed in runs:
                for t, err in gradient_errors(c, RECIPES[n], seed, data_seed, args.gradients).items():
                    worst[t] = max(worst.get(t, 0.0), err)
            is_linear = lambda t: any(f".{g}." in t for g in ("qkv", "proj", "fc1", "fc2"))  # noqa: E731
            linear = max(v for t, v in worst.items() if is_linear(t))
            other = max(v for t, v in worst.items() if not is_linear(t))
            print(f"  {n:20s} linear weights {linear:.4f}  other tensors {other:.4f}  "
                  + " ".join(f"{t.replace('layers.', 'L').replace('.weight', '')}={v:.3f}" for t, v in worst.items()),
                  flush=True)
        return
    gaps, early = {n: [] for n in names}, {n: [] for n in names}
    for seed, data_seed in runs:
        results = {n: train(c, RECIPES[n], seed, data_seed, args.steps) for n in names}
        base = tail(results["bf16"])
        for n in names:
            got = results[n]
            gaps[n].append(tail(got) - base)
            early[n].append(max(abs(g / b - 1) for g, b in zip(got[:12], results["bf16"][:12])))
            if not args.quiet:
                print(f"seed {seed} data {data_seed} {n:20s} loss {got[0]:.4f} -> {got[-1]:.4f}, last ten "
                      f"{tail(got):.4f} (bf16 {base:.4f}, {tail(got) - base:+.4f}), steps 0-11 within "
                      f"{100 * early[n][-1]:.2f}% of bf16's", flush=True)
    print(f"width {w}, {args.steps} steps, {len(runs)} run(s): last-ten mean minus bf16's")
    for n in names:
        g = gaps[n]
        spread = statistics.stdev(g) if len(g) > 1 else 0.0
        sat = SATURATED.get(n, [0, 0])
        print(f"  {n:20s} mean {statistics.mean(g):+.4f}  sd {spread:.4f}  min {min(g):+.4f}  max {max(g):+.4f}  "
              f"(steps 0-11: within {100 * max(early[n]):.2f}%)"
              + (f"  dY saturated {sat[0]} of {sat[1]} ({100 * sat[0] / max(sat[1], 1):.4f}%)" if sat[1] else ""))


if __name__ == "__main__":
    main()
