"""PyTorch reference for dlm's model parallelism on 2 GPUs: tensor parallelism with sequence parallelism
(tp2sp) and pipeline parallelism (pp2), training benchmarks/train/torch_reference.py's model and masked-diffusion loss
as a PyTorch user would: bf16 autocast over fp32 parameters (autocast works on DTensors, so no bf16-parameter
variant), fused AdamW, global-norm clipping at 1.0, torch.compile per transformer block. One model replica: each step
the whole global batch goes through both GPUs as micro-batches of the config's size (350m: 32 = 4 x 8).

tp2sp, torch.distributed.tensor.parallel as in torchtitan's Llama recipe (mesh of the 2 ranks); the residual stream
between and inside blocks is a DTensor sharded on the sequence (Shard(1)), so Block.forward sees the global shape:
  emb   RowwiseParallel: vocabulary-sharded, its output reduce-scattered over the sequence
  norms ln1, ln2, ln_f: replicated DTensor weights on the sequence shard (what SequenceParallel would make of norm
        modules; the reference applies them with F.rms_norm inside Block.forward). Their gradients come back
        Partial(sum) and are summed in one all-reduce with the q/k-norm weights', which stay plain tensors applied
        to the local heads (the embedding's Replicate gradient is sliced back to its Shard(0))
  qkv   ColwiseParallel, sequence all-gathered in, local heads out. The reference's fused QKV rows are grouped per KV
        group ([group][q heads of the group, k, v][head dim]), so each rank's contiguous half is whole KV groups: the
        sharding is by KV group, and each block's head and group counts are set to the local ones
  proj  RowwiseParallel, reduce-scattered over the sequence
  fc1   ColwiseParallel on rows permuted to [gate part r, up part r] for rank r, so the block's chunk(2) stays right;
  fc2   RowwiseParallel on the matching columns, reduce-scattered over the sequence
  out   ColwiseParallel, logits left as a vocabulary-sharded DTensor: cross-entropy under loss_parallel
pp2, torch.distributed.pipelining Schedule1F1B: stage 0 = embedding + first half of the layers, stage 1 = second
  half + final norm + output + loss; clipping sums the squared gradient norm over the stages.
Every micro-batch's mask draws come from torch.manual_seed(its step and index) just before diffusion_loss, so all
ranks, and --check's single-process replay, see the same masked inputs (pp2's last stage gets the seed in the target).

usage: torchrun --nproc_per_node 2 torch_mp.py --layout tp2sp|pp2 [--config 350m] [--global-batch 32] [--steps 10]
       [--warmup 3] [--no-compile] [--check]
--check: fp32, no autocast; rank 0 replays the same steps in one process and fails if a step's loss differs by more
than 1e-3 relative or its gradient norm by more than 1e-5 (fp32 on the CPU agrees to ~1e-7; the norm is what shows a
norm weight's gradient left unsummed, 7e-5). On the CPU: gloo, --no-compile, e.g. --config tiny --global-batch 8.
Rank 0 prints one JSON line: tokens/s of the job and per GPU, step ms, peak memory per rank, step losses.
"""
import argparse
import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from torch_reference import CONFIGS, Model, diffusion_loss, rope_tables  # noqa: E402
from timing import peak_gib_per_rank, timed  # noqa: E402


def seed_of(step, k, n):
    return 1 + step * n + k


def tensor_parallel(model, mesh):
    """Shards model in place over mesh (see the docstring)."""
    tp = mesh.size()
    seq_out = dict(output_layouts=Shard(1), use_local_output=False)  # the residual stream: a DTensor on Shard(1)
    replicate = lambda w: torch.nn.Parameter(distribute_tensor(w.data, mesh, [Replicate()]))
    for blk in model.layers:
        f = blk.fc2.in_features
        w = blk.fc1.weight.data  # rows [gate 0..f, up 0..f] -> per rank r [gate part r, up part r]
        blk.fc1.weight.data = w.view(2, tp, f // tp, -1).transpose(0, 1).reshape(2 * f, -1).contiguous()
        parallelize_module(blk, mesh, {"qkv": ColwiseParallel(input_layouts=Shard(1)),
                                       "proj": RowwiseParallel(**seq_out),
                                       "fc1": ColwiseParallel(input_layouts=Shard(1)),
                                       "fc2": RowwiseParallel(**seq_out)})
        blk.ln1, blk.ln2 = replicate(blk.ln1), replicate(blk.ln2)
        assert blk.g % tp == 0, "TP shards by KV group"
        blk.h, blk.g = blk.h // tp, blk.g // tp
    parallelize_module(model, mesh, {"emb": RowwiseParallel(input_layouts=Replicate(), **seq_out),
                                     "out": ColwiseParallel(input_layouts=Shard(1), use_local_output=False)})
    model.ln_f = replicate(model.ln_f)


class Stage(torch.nn.Module):
    """Layers [lo, hi) of a Model, with its embedding on the first stage and its final norm + output on the last."""

    def __init__(self, model, lo, hi):
        super().__init__()
        self.c, self.first, self.last = model.c, lo == 0, hi == len(model.layers)
        self.emb = model.emb if self.first else None
        self.layers = model.layers[lo:hi]
        self.ln_f = model.ln_f if self.last else None
        self.out = model.out if self.last else None

    def forward(self, x):
        cos, sin = rope_tables(x.shape[1], self.c["head_dim"], 10000.0, x.device)
        x = self.emb(x) if self.first else x
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.out(F.rms_norm(x, (x.shape[-1],), self.ln_f, 1e-6)) if self.last else x


class _Input(Exception):
    pass


def masked_input(tokens, mask_id, seed):
    """The model input diffusion_loss draws for tokens under seed (all its draws come before the model call)."""
    def grab(x):
        raise _Input(x)
    torch.manual_seed(seed)
    try:
        diffusion_loss(grab, tokens, mask_id)
    except _Input as e:
        return e.args[0]


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def reduce_tp_grads(params):
    """Sums over the ranks, in one all-reduce, the gradients that are per-rank partial sums (the plain q/k-norm
    weights', and the replicated norm weights' DTensors on Partial(sum)), then puts every DTensor gradient on its
    parameter's placement (the embedding's comes back Replicate: its rows are sliced locally)."""
    ps = [p for p in params if not isinstance(p.grad, DTensor) or p.grad.placements[0].is_partial()]
    grads = [local(p.grad) for p in ps]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    for p, g, f in zip(ps, grads, flat.split([g.numel() for g in grads])):
        g.copy_(f.view_as(g))
        if isinstance(p.grad, DTensor):
            p.grad = DTensor.from_local(g, p.grad.device_mesh, [Replicate()], run_check=False)
    for p in params:
        if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
            p.grad = p.grad.redistribute(placements=p.placements)


@torch.no_grad()
def clip_grad_norm(params, replicas, max_norm=1.0):
    """torch.nn.utils.clip_grad_norm_ over parameters spread on the ranks: a sharded DTensor counts its local shard,
    a gradient that each of `replicas` ranks holds whole counts 1/replicas on each, the squares summed over ranks."""
    sharded = lambda g: isinstance(g, DTensor) and any(pl.is_shard() for pl in g.placements)
    sq = torch.stack([local(p.grad).float().square().sum() * (1.0 if sharded(p.grad) else 1.0 / replicas)
                      for p in params]).sum()
    dist.all_reduce(sq)
    coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    for p in params:
        local(p.grad).mul_(coef)
    return sq.sqrt()


def replay(c, tokens, steps):
    """Every step's loss and gradient norm of the same training in one process: what --check compares with."""
    torch.manual_seed(0)
    model = Model(c).to(tokens.device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    n, out = tokens.shape[0], []
    for i in range(steps):
        total = 0.0
        for k in range(n):
            torch.manual_seed(seed_of(i, k, n))
            loss = diffusion_loss(model, tokens[k], c["vocab"] - 1) / n
            loss.backward()
            total += float(loss)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        out.append((total, float(norm)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", choices=["tp2sp", "pp2"], required=True)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="350m")
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--check", action="store_true", help="fp32; compare every step's loss with one process")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a local test (gloo, --no-compile)
    dist.init_process_group("nccl" if dev == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if dev == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    c = dict(CONFIGS[args.config])
    b, s, mask_id = c["batch"], c["seq"], c["vocab"] - 1
    assert args.global_batch % b == 0, "global batch must be a multiple of the micro-batch"
    n = args.global_batch // b
    amp = contextlib.nullcontext() if args.check else torch.autocast(dev, dtype=torch.bfloat16)
    torch.manual_seed(0)  # the same initial weights on every rank and in --check's replay
    model = Model(c)
    torch.manual_seed(1)
    tokens = torch.randint(0, mask_id, (n, b, s)).to(dev)  # one replica: every rank sees the whole batch

    if args.layout == "tp2sp":
        model.to(dev)
        tensor_parallel(model, init_device_mesh(dev, (world,)))
        params = list(model.parameters())
        for blk in model.layers if args.compile else []:
            blk.compile()

        def step(i):
            total = torch.zeros((), device=dev)
            for k in range(n):
                torch.manual_seed(seed_of(i, k, n))
                # implicit_replication: the loss's plain tensors (masks, p_mask) act as replicated DTensors
                with loss_parallel(), implicit_replication():
                    with amp:
                        loss = diffusion_loss(model, tokens[k], mask_id) / n
                    loss.backward()
                total += local(loss.detach())
            reduce_tp_grads(params)
            return total
    else:
        assert world == 2 and c["layers"] % 2 == 0 and n >= 2
        half = c["layers"] // 2
        stage_mod = Stage(model, rank * half, (rank + 1) * half).to(dev)
        del model
        params = list(stage_mod.parameters())
        for blk in stage_mod.layers if args.compile else []:
            blk.compile()
        stage = PipelineStage(stage_mod, rank, world, torch.device(dev))

        def loss_fn(logits, target):  # target: a micro-batch's tokens and its mask seed, from which it redraws the mask
            torch.manual_seed(int(target[0, -1]))  # (a call count would not do: some versions call it at set-up)
            return diffusion_loss(lambda _: logits, target[:, :-1], mask_id) / n

        schedule = Schedule1F1B(stage, n, loss_fn=loss_fn, scale_grads=False)

        def step(i):
            seeds = [seed_of(i, k, n) for k in range(n)]
            with amp:
                if rank == 0:
                    schedule.step(torch.cat([masked_input(tokens[k], mask_id, seeds[k]) for k in range(n)]))
                    return torch.zeros((), device=dev)
                seed_col = torch.tensor(seeds, device=dev).repeat_interleave(b)[:, None]
                losses = []
                schedule.step(target=torch.cat([tokens.flatten(0, 1), seed_col], dim=1), losses=losses)
                return torch.stack(losses).detach().sum()

    # fused AdamW takes DTensors and plain tensors only in separate groups
    groups = [[p for p in params if isinstance(p, DTensor) == d] for d in (True, False)]
    opt = torch.optim.AdamW([{"params": g} for g in groups if g], lr=2e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)

    def train_step(i):
        loss = step(i)
        norms.append(clip_grad_norm(params, replicas=world if args.layout == "tp2sp" else 1))
        opt.step()
        opt.zero_grad(set_to_none=True)  # a step's norm gradients start Partial, not Replicate
        return loss

    norms = []
    losses, dt = timed(train_step, 0 if args.check else args.warmup, args.steps, dev)
    losses = torch.stack(losses)
    if args.layout == "pp2":
        dist.all_reduce(losses)  # only the last stage has them
    peaks = peak_gib_per_rank(dev)
    tps = args.global_batch * s / dt
    if rank == 0:
        out = dict(peer=f"torch-{args.layout}", layout=args.layout, config=args.config, gpus=world,
                   global_batch=args.global_batch, micro_batch=b, seq=s, compile=args.compile, step_ms=dt * 1e3,
                   tokens_per_s=tps, tokens_per_s_per_gpu=tps / world, peak_gib=max(peaks),
                   peak_gib_per_rank=peaks, losses=[float(l) for l in losses])
        if args.check:
            ref = replay(c, tokens, args.steps)
            # the gradient norms catch what the losses of a few steps cannot: a gradient not summed or counted twice
            out.update(grad_norms=[float(g) for g in norms], reference_losses=[r[0] for r in ref],
                       reference_grad_norms=[r[1] for r in ref])
            rel = lambda xs, ys: max(abs(x - y) / abs(y) for x, y in zip(xs, ys))
            out["loss_rel_diff"] = rel(out["losses"], out["reference_losses"])
            out["grad_norm_rel_diff"] = rel(out["grad_norms"], out["reference_grad_norms"])
        print(json.dumps(out), flush=True)
        failed = args.check and (out["loss_rel_diff"] > 1e-3 or out["grad_norm_rel_diff"] > 1e-5)
    dist.destroy_process_group()
    if rank == 0 and failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
