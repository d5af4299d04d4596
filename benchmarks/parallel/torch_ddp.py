"""PyTorch DDP reference for dp_bench: the model and masked-diffusion loss of benchmarks/train/torch_reference.py
under DistributedDataParallel (NCCL, default 25 MB buckets overlapped with the backward) and torch.compile, bf16
autocast over fp32 parameters, fused AdamW, clipping at 1.0; the same global batch on any number of GPUs (micro-batch
the config's, gradient accumulation under no_sync for all but the last micro-batch of a step).

usage: torchrun --nproc_per_node P torch_ddp.py [--config 350m] [--global-batch 32] [--steps 10] [--warmup 3]
Rank 0 prints one JSON line: tokens/s of the job and per GPU, peak memory, step losses.
"""
import argparse
import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from torch_reference import CONFIGS, Model, diffusion_loss  # noqa: E402
from timing import peak_gib_per_rank, timed  # noqa: E402


class LossModule(torch.nn.Module):
    """The loss as the module's forward, so DDP hooks the backward and torch.compile sees one graph."""

    def __init__(self, model, mask_id):
        super().__init__()
        self.model, self.mask_id = model, mask_id

    def forward(self, tokens):
        return diffusion_loss(self.model, tokens, self.mask_id)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=sorted(CONFIGS), default="350m")
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a local smoke test (gloo, --no-compile)
    dist.init_process_group("nccl" if dev == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    if dev == "cuda":
        torch.cuda.set_device(local)
    c = dict(CONFIGS[args.config])
    b, s = c["batch"], c["seq"]
    assert args.global_batch % (b * world) == 0, "global batch must be a multiple of micro-batch x GPUs"
    n_local = args.global_batch // (b * world)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    ddp = torch.nn.parallel.DistributedDataParallel(LossModule(Model(c).to(dev), c["vocab"] - 1),
                                                    device_ids=[local] if dev == "cuda" else None,
                                                    gradient_as_bucket_view=True)
    loss_fn = torch.compile(ddp) if args.compile else ddp
    opt = torch.optim.AdamW(ddp.parameters(), lr=2e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev == "cuda")
    torch.manual_seed(1 + rank)
    tokens = torch.randint(0, c["vocab"] - 1, (n_local, b, s), device=dev)

    def step():
        total = torch.zeros((), device=dev)
        for k in range(n_local):
            ctx = ddp.no_sync() if k + 1 < n_local else contextlib.nullcontext()
            with ctx:
                with torch.autocast(dev, dtype=torch.bfloat16):
                    loss = loss_fn(tokens[k]) / n_local  # DDP averages the gradients over the ranks
                loss.backward()
            total += loss.detach() / world
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        return total

    losses, dt = timed(lambda i: step(), args.warmup, args.steps, dev)
    for l in losses:
        dist.all_reduce(l)
    peak = max(peak_gib_per_rank(dev))
    tps = args.global_batch * s / dt
    if rank == 0:
        print(json.dumps(dict(peer="torch-ddp", config=args.config, gpus=world, global_batch=args.global_batch,
                              micro_batch=b, seq=s, compile=args.compile, step_ms=dt * 1e3, tokens_per_s=tps,
                              tokens_per_s_per_gpu=tps / world, peak_gib=peak, losses=[float(l) for l in losses])),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
