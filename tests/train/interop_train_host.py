"""Interop: libtrain's host-side training and sampling math against its peers and the spec.

- LR schedules against megatron-core's OptimizerParamScheduler (exact, every style and WSD tail),
- AdamW + global-norm clipping against torch.optim.AdamW and torch.nn.utils.clip_grad_norm_,
- the diffusion (MegaDLMs/LLaDA generate) and AR samplers against a numpy implementation of
  their rules (docs/generation.md) on a synthetic model, with the same counter-based noise.
argv: train_host_tool"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.environ.get("DLM_SOURCE_DIR", "."), "tests", "interop"))
from dlm_interop import Checks, require, run, workdir  # noqa: E402

np, torch = require("numpy", "torch")
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # noqa: E402

tool = sys.argv[1]
checks = Checks()


def ask(request):
    return json.loads(run([tool], input=json.dumps(request)).stdout)


# ---- LR schedules ---------------------------------------------------------------------------------
class _Opt:
    param_groups = [{}]


GBS = 8  # Megatron counts samples; dlm counts iterations
cases = [
    dict(style="linear", warmup=10, decay=100),
    dict(style="cosine", warmup=10, decay=100),
    dict(style="cosine", warmup=0, decay=37),
    dict(style="constant", warmup=5, decay=50),
    dict(style="inverse-square-root", warmup=7, decay=60),
] + [dict(style="WSD", warmup=20, decay=100, wsd_decay=30, wsd_style=s)
     for s in ("linear", "cosine", "exponential", "minus_sqrt")]
for case in cases:
    steps = list(range(0, case["decay"] + 15))
    ours = ask(dict(op="lr", max_lr=2e-4, min_lr=2e-5, init_lr=1e-6, steps=steps, global_batch_size=GBS, **case))["lr"]
    sched = OptimizerParamScheduler(
        _Opt(), init_lr=1e-6, max_lr=2e-4, min_lr=2e-5, lr_warmup_steps=case["warmup"] * GBS,
        lr_decay_steps=case["decay"] * GBS, lr_decay_style=case["style"], start_wd=0.1, end_wd=0.1,
        wd_incr_steps=case["decay"] * GBS, wd_incr_style="constant",
        wsd_decay_steps=case.get("wsd_decay", 0) * GBS or None, lr_wsd_decay_style=case.get("wsd_style"))
    theirs = []
    for s in steps:
        sched.num_steps = s * GBS
        theirs.append(sched.get_lr({}))
    bad = [(s, a, b) for s, a, b in zip(steps, ours, theirs) if a != b]
    checks.check(not bad, f"lr {case}: differs from megatron-core at {bad[:3]}")

# Sample counts that are not whole iterations (--train-samples with --lr-*-samples, --lr-warmup-fraction): the
# boundaries fall inside an iteration; Megatron's scheduler still steps by the global batch.
sample_cases = [
    dict(style="linear", warmup_samples=12, decay_samples=643),
    dict(style="cosine", warmup_samples=0.01 * 643, decay_samples=643),   # --lr-warmup-fraction 0.01
    dict(style="cosine", warmup_samples=0.3 * 6 * GBS, decay_samples=6 * GBS),  # fraction 0.3 of 6 iterations
    dict(style="inverse-square-root", warmup_samples=13, decay_samples=501),
    dict(style="constant", warmup_samples=5, decay_samples=99),
] + [dict(style="WSD", warmup_samples=20, decay_samples=803, wsd_decay_samples=81, wsd_style=s)
     for s in ("linear", "cosine", "exponential", "minus_sqrt")]
for case in sample_cases:
    steps = list(range(0, case["decay_samples"] // GBS + 5))
    ours = ask(dict(op="lr", max_lr=2e-4, min_lr=2e-5, init_lr=1e-6, steps=steps, global_batch_size=GBS, warmup=0,
                    decay=1, **case))["lr"]
    sched = OptimizerParamScheduler(
        _Opt(), init_lr=1e-6, max_lr=2e-4, min_lr=2e-5, lr_warmup_steps=case["warmup_samples"],
        lr_decay_steps=case["decay_samples"], lr_decay_style=case["style"], start_wd=0.1, end_wd=0.1,
        wd_incr_steps=case["decay_samples"], wd_incr_style="constant",
        wsd_decay_steps=case.get("wsd_decay_samples"), lr_wsd_decay_style=case.get("wsd_style"))
    theirs = []
    for _ in steps:  # as training does: get_lr, then step(increment = global batch)
        theirs.append(sched.get_lr({}))
        sched.step(GBS)
    bad = [(s, a, b) for s, a, b in zip(steps, ours, theirs) if a != b]
    checks.check(not bad, f"lr in samples {case}: differs from megatron-core at {bad[:3]}")

# ---- the masked-diffusion loss against MegaDLMs' formula in torch ---------------------------------
def megadlms_loss(tokens, labels, loss_mask, logits, masked, kind):
    """pretrain_difflm's loss on the (un-shifted) batch, given the masks dlm drew."""
    if kind == "difflm-noshift":
        labels = labels[:, :-1]
        loss_mask = loss_mask[:, :-1]
        p_mask = masked.sum(dim=1, keepdim=True) / masked.shape[1]
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
        return ((ce * masked / p_mask) * loss_mask).sum() / loss_mask.sum()
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    return (ce * loss_mask).sum() / loss_mask.sum()


B, L, V = 3, 9, 11
for kind, seed in [("difflm-noshift", 1), ("difflm-noshift", 2), ("vanilla", 3)]:
    gen = np.random.default_rng(seed)
    sample = gen.integers(0, V - 1, size=(B, L + 1))
    tokens, labels = sample[:, :-1], sample[:, 1:]
    loss_mask = (gen.random((B, L)) > 0.2).astype(np.float32)
    n = L - 1 if kind == "difflm-noshift" else L
    logits = gen.standard_normal((B, n, V)).astype(np.float32)
    got = ask(dict(op="objective", kind=kind, seed=seed, mask=V - 1, varilen_prob=0.0, iteration=0,
                   micro_batches=1, micro_batch=0, tokens=tokens.tolist(), labels=labels.tolist(),
                   loss_mask=loss_mask.tolist(), sample_index=[100 + b for b in range(B)],
                   logits=logits.reshape(B * n, V).tolist()))
    checks.check(got["seq"] == n, f"{kind}: seq {got['seq']} != {n}")
    masked = np.array(got["masked"] or [1] * (B * n)).reshape(B, n)
    if kind == "difflm-noshift":
        expected_input = np.where(masked == 1, V - 1, tokens[:, 1:])
        checks.check((np.array(got["input_ids"]).reshape(B, n) == expected_input).all(), f"{kind}: input ids")
        checks.check((np.array(got["labels"]).reshape(B, n) == labels[:, :-1]).all(), f"{kind}: labels not un-shifted")
        checks.check((masked.sum(axis=1) >= 1).all(), f"{kind}: a row without a masked position")
    ref = float(megadlms_loss(torch.from_numpy(tokens), torch.from_numpy(labels), torch.from_numpy(loss_mask),
                              torch.from_numpy(logits), torch.from_numpy(masked.astype(np.float32)), kind))
    checks.check(abs(got["loss"] - ref) <= 1e-5 * abs(ref), f"{kind}: loss {got['loss']} != torch {ref}")

# ---- the variable-length draw against numpy's legacy RandomState ---------------------------------
for prob, length in [(0.5, 2048), (0.01, 4097), (1.0, 5), (0.3, 3)]:
    seeds = list(range(0, 400)) + [2**31 + 7, 2**32 - 1]
    ours = ask(dict(op="varilen", prob=prob, length=length, seeds=seeds))["lengths"]
    theirs = []
    for seed in seeds:
        rs = np.random.RandomState(seed)
        u = rs.uniform(0, 1)
        r = rs.randint(2, length + 1)
        theirs.append(int(r) if u < prob else length)
    bad = [(s, a, b) for s, a, b in zip(seeds, ours, theirs) if a != b]
    checks.check(not bad, f"variable length p={prob} L={length}: differs from numpy at {bad[:3]}")

# ---- TensorBoard event files, read by tensorboard's own reader -----------------------------------
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402

tb_dir = os.path.join(workdir("tb"), "run")
events = [[k, {"train/loss": 10.0 / (k + 1), "train/lr": 1e-4 * k}] for k in range(1, 30)]
path = ask(dict(op="tensorboard", dir=tb_dir, events=events))["path"]
acc = event_accumulator.EventAccumulator(tb_dir)
acc.Reload()
checks.check(sorted(acc.Tags()["scalars"]) == ["train/loss", "train/lr"], f"tensorboard tags {acc.Tags()}")
got = [(e.step, e.value) for e in acc.Scalars("train/loss")]
checks.check(got == [(k, float(np.float32(10.0 / (k + 1)))) for k in range(1, 30)], f"tensorboard loss {got[:3]}")
# tensorboard's record reader checks both CRCs; a flipped byte must be caught.
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New  # noqa: E402

reader = PyRecordReader_New(path.encode())
records = 0
while True:
    try:
        reader.GetNext()
        records += 1
    except Exception:
        break
checks.check(records == 30, f"tensorboard: {records} records, expected 30")

# ---- AdamW + clipping -----------------------------------------------------------------------------
rng = np.random.default_rng(5)
shapes = [(7, 5), (5,), (3, 4)]
no_decay = [False, True, False]
params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
n_steps = 6
grads = [[(rng.standard_normal(s) * (3.0 if k % 2 else 0.1)).astype(np.float32) for s in shapes] for k in range(n_steps)]
lrs = [1e-3 * (k + 1) for k in range(n_steps)]
opts = dict(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip=1.0)
ours = ask(dict(op="adamw", params=[p.ravel().tolist() for p in params], no_decay=no_decay,
                grads=[[g.ravel().tolist() for g in gs] for gs in grads], lrs=lrs, **opts))["params"]
tp = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params]
groups = [{"params": [p for p, nd in zip(tp, no_decay) if not nd], "weight_decay": 0.1},
          {"params": [p for p, nd in zip(tp, no_decay) if nd], "weight_decay": 0.0}]
topt = torch.optim.AdamW(groups, lr=1.0, betas=(0.9, 0.95), eps=1e-8, foreach=False)
for k in range(n_steps):
    for p, g in zip(tp, grads[k]):
        p.grad = torch.from_numpy(g.copy())
    torch.nn.utils.clip_grad_norm_(tp, 1.0, foreach=False)
    for group in topt.param_groups:
        group["lr"] = lrs[k]
    topt.step()
worst = max(float(np.max(np.abs(np.array(o, dtype=np.float32) - p.detach().numpy().ravel()))) for o, p in zip(ours, tp))
print(f"AdamW after {n_steps} clipped steps: max |dlm - torch| = {worst:.3g}")
checks.check(worst <= 1e-6, f"AdamW differs from torch by {worst}")


# ---- samplers: a numpy implementation of the spec -------------------------------------------------
M32 = 0xFFFFFFFF


def philox(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def uniform(seed, domain, index, sub):
    b = philox((index & M32, index >> 32, sub, domain), (seed & M32, seed >> 32))
    return ((b[0] >> 5) * 67108864.0 + (b[1] >> 6)) / 9007199254740992.0


GUMBEL, RANDOM_CONF = 11, 12


class Synthetic:
    def __init__(self, vocab, positions, ctx, seed):
        r = np.random.default_rng(seed)
        self.A = (r.standard_normal((vocab, vocab)) * 2).astype(np.float32)
        self.B = (r.standard_normal((positions, vocab))).astype(np.float32)
        self.C = (r.standard_normal((ctx, vocab))).astype(np.float32)

    def __call__(self, ids, att, pos):
        sums = (ids * att).sum(axis=1) % len(self.C)
        return (self.A[ids] + self.B[pos]) + self.C[sums][:, None, :]

    def tables(self):
        return dict(A=self.A.tolist(), B=self.B.tolist(), C=self.C.tolist())


def left_pad(prompts, extra, fill, pad):
    longest = max(len(p) for p in prompts)
    ids = np.full((len(prompts), longest + extra), fill, dtype=np.int64)
    att = np.ones_like(ids)
    for r, p in enumerate(prompts):
        ids[r, :longest - len(p)] = pad
        att[r, :longest - len(p)] = 0
        ids[r, longest - len(p):longest] = p
    pos = np.maximum(np.cumsum(att, axis=1) - 1, 0)
    return ids, att, pos, longest


def softmax64(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def top_p(l, p):
    if p >= 1:
        return l
    probs = softmax64(l)
    order = np.argsort(-probs, kind="stable")
    before = np.concatenate([[0.0], np.cumsum(probs[order])[:-1]])
    l = l.copy()
    l[order[before > p]] = -np.inf
    return l


def top_k(l, k):
    if k <= 0 or k >= len(l):
        return l
    order = np.argsort(-l, kind="stable")
    l = l.copy()
    l[order[k:]] = -np.inf
    return l


def gumbel_argmax(l, temperature, seed, draw):
    if temperature > 0:
        u = np.array([1.0 - uniform(seed, GUMBEL, draw, v) for v in range(len(l))])
        l = l - temperature * np.log(-np.log(u))
    return int(np.argmax(l))


def diffusion_reference(model, prompts, o):
    mask = o["mask"]
    x, att, pos, plen = left_pad(prompts, o["gen_length"], mask, 0)
    rows, length = x.shape
    is_prompt = np.zeros_like(x, dtype=bool)
    is_prompt[:, :plen] = att[:, :plen] == 1
    blocks = o["gen_length"] // o["block_length"]
    steps = o["steps"] // blocks
    serial = 0
    for b in range(blocks):
        end = plen + (b + 1) * o["block_length"]
        n = (x[:, end - o["block_length"]:end] == mask).sum(axis=1)
        counts = np.array([[n[r] // steps + (1 if i < n[r] % steps else 0) for i in range(steps)] for r in range(rows)])
        for i in range(steps):
            logits = model(x, att, pos)
            if o.get("cfg", 0) > 0:
                un = x.copy()
                un[is_prompt] = mask
                u = model(un, att, pos)
                w = np.float32(o["cfg"])
                logits = u + (w + np.float32(1)) * (logits - u)
            for r in range(rows):
                conf = np.full(length, -np.inf)
                x0 = x[r].copy()
                for j in range(end):
                    if x[r, j] != mask or not att[r, j]:
                        continue
                    draw = (serial * rows + r) * length + j
                    l = top_p(logits[r, j].astype(np.float64), o.get("top_p", 1.0))
                    x0[j] = gumbel_argmax(l, o["temperature"], o["seed"], draw)
                    if o["remasking"] == "low_confidence":
                        conf[j] = softmax64(logits[r, j])[x0[j]]
                    else:
                        conf[j] = uniform(o["seed"], RANDOM_CONF, draw, 0)
                order = np.argsort(-conf, kind="stable")[:counts[r, i]]
                order = order[np.isfinite(conf[order])]
                x[r, order] = x0[order]
            serial += 1
    out = []
    for r in range(rows):
        gen = x[r, plen:].tolist()
        if "eos" in o and o["eos"] in gen:
            gen = gen[:gen.index(o["eos"])]
        out.append(gen)
    return out


def ar_reference(model, prompts, o):
    x, att, pos, _ = left_pad(prompts, 0, 0, 0)
    rows = len(prompts)
    out = [[] for _ in prompts]
    done = [False] * rows
    for step in range(o["max_new_tokens"]):
        logits = model(x, att, pos)
        nxt = []
        for r in range(rows):
            tok = 0
            if not done[r]:
                l = logits[r, -1].astype(np.float64)
                if o["temperature"] > 0:
                    l = l / o["temperature"]
                l = top_p(top_k(l, o.get("top_k", 0)), o.get("top_p", 1.0))
                tok = gumbel_argmax(l, 1.0 if o["temperature"] > 0 else 0.0, o["seed"], step * rows + r)
                if "eos" in o and tok == o["eos"]:
                    done[r] = True
                else:
                    out[r].append(tok)
            nxt.append(tok)
        if all(done):
            break
        x = np.concatenate([x, np.array(nxt)[:, None]], axis=1)
        att = np.concatenate([att, np.ones((rows, 1), dtype=att.dtype)], axis=1)
        pos = np.concatenate([pos, pos[:, -1:] + 1], axis=1)
    return out


VOCAB, MASK = 16, 15
model = Synthetic(VOCAB, 64, 7, seed=11)
prompts = [[1, 2, 3, 4], [5, 6], [7]]
diffusion_cases = [
    dict(gen_length=8, steps=8, block_length=8, temperature=0.0, remasking="low_confidence", seed=0),
    dict(gen_length=12, steps=6, block_length=4, temperature=0.0, remasking="low_confidence", seed=0),
    dict(gen_length=12, steps=12, block_length=6, temperature=0.7, remasking="low_confidence", seed=3),
    dict(gen_length=8, steps=4, block_length=4, temperature=1.0, remasking="random", seed=9, top_p=0.8),
    dict(gen_length=8, steps=8, block_length=4, temperature=0.5, remasking="low_confidence", seed=2, cfg=1.5),
    dict(gen_length=10, steps=4, block_length=5, temperature=0.0, remasking="random", seed=4, eos=3),
]
for case in diffusion_cases:
    case = dict(case, mask=MASK)
    ours = ask(dict(op="diffusion", prompts=prompts, **model.tables(), **case))["out"]
    ref = diffusion_reference(model, prompts, case)
    checks.check(ours == ref, f"diffusion sampler {case}: {ours} != {ref}")

ar_cases = [
    dict(max_new_tokens=10, temperature=0.0, seed=0),
    dict(max_new_tokens=10, temperature=0.9, top_k=5, seed=1),
    dict(max_new_tokens=10, temperature=1.2, top_p=0.7, seed=2, eos=4),
]
for case in ar_cases:
    ours = ask(dict(op="ar", prompts=prompts, **model.tables(), **case))["out"]
    ref = ar_reference(model, prompts, case)
    checks.check(ours == ref, f"AR sampler {case}: {ours} != {ref}")

checks.finish()
