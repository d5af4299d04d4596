"""Timing and memory of the PyTorch references' steps under torch.distributed (torch_ddp.py, torch_mp.py)."""
import time

import torch
import torch.distributed as dist


def timed(train_step, warmup, steps, dev):
    """train_step(i) for warmup untimed steps, then for steps timed between barriers (peak memory counted from the
    first of them); returns the timed steps' results and the seconds per step."""
    for i in range(warmup):
        train_step(i)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    sync()
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    dist.barrier()
    t0 = time.perf_counter()
    out = [train_step(warmup + i) for i in range(steps)]
    sync()
    dist.barrier()
    return out, (time.perf_counter() - t0) / steps


def peak_gib_per_rank(dev):
    """Every rank's peak allocated device memory since timed() reset it, GiB (0 on the CPU), on every rank."""
    world = dist.get_world_size()
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else 0.0], device=dev)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    return [float(p) for p in peaks]
