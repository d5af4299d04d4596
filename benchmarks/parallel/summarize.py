"""Reads device_dp.sh's JSON lines (dlm_1gpu, dlm_dp2, dlm_dp2_nooverlap, torch_1gpu, torch_dp2, torch_tp2sp,
torch_pp2 in DIR) and prints tokens/s per GPU, the DP2 / 1-GPU ratios, dlm's losses on 1 GPU and DP2 side by side,
PyTorch's TP2+SP / PP2 losses and memory per rank (and dlm / PyTorch where a dlm_tp2sp or dlm_pp2 result is there),
and dlm's device memory beside the dry run's plan. usage: summarize.py DIR"""
import json
import os
import sys


def load(d, name):
    try:
        lines = [l for l in open(os.path.join(d, name + ".json")) if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except OSError:
        return None


def main():
    d = sys.argv[1]
    runs = {n: load(d, n) for n in ("dlm_1gpu", "dlm_dp2", "dlm_dp2_nooverlap", "torch_1gpu", "torch_dp2",
                                    "torch_tp2sp", "torch_pp2")}
    print(f"{'run':20} {'GPUs':>4} {'step ms':>9} {'tokens/s':>10} {'per GPU':>9} {'memory GiB':>11}")
    for n, r in runs.items():
        if r:
            mem = r.get("device_used_gib", r.get("peak_gib", 0.0))
            print(f"{n:20} {r['gpus']:>4} {r['step_ms']:>9.1f} {r['tokens_per_s']:>10.0f} {r['tokens_per_s_per_gpu']:>9.0f} {mem:>11.2f}")
        else:
            print(f"{n:20} (no result)")
    for peer in ("dlm", "torch"):
        one, two = runs[f"{peer}_1gpu"], runs[f"{peer}_dp2"]
        if one and two:
            print(f"{peer}: DP2 / 1 GPU = {two['tokens_per_s'] / one['tokens_per_s']:.3f}x (target >= 1.9x)")
    if runs["dlm_dp2"] and runs["torch_dp2"]:
        print(f"dlm DP2 / torch DDP DP2 = {runs['dlm_dp2']['tokens_per_s'] / runs['torch_dp2']['tokens_per_s']:.3f}x")
    if runs["dlm_dp2_nooverlap"] and runs["dlm_dp2"]:
        print(f"dlm DP2 overlap / no overlap = {runs['dlm_dp2']['tokens_per_s'] / runs['dlm_dp2_nooverlap']['tokens_per_s']:.3f}x")
    for layout in ("tp2sp", "pp2"):
        r, mine = runs[f"torch_{layout}"], load(d, f"dlm_{layout}")
        if r:
            mem = " ".join(f"{m:.2f}" for m in r["peak_gib_per_rank"])
            print(f"torch {layout} (compile {r['compile']}): memory per rank {mem} GiB, losses",
                  " ".join(f"{x:.4f}" for x in r["losses"]))
        if r and mine:
            print(f"dlm {layout} / torch {layout} = {mine['tokens_per_s'] / r['tokens_per_s']:.3f}x")
    one, two = runs["dlm_1gpu"], runs["dlm_dp2"]
    if one and two:
        a, b = one["losses"], two["losses"]
        worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
        print("dlm losses 1 GPU:", " ".join(f"{x:.4f}" for x in a))
        print("dlm losses DP2  :", " ".join(f"{x:.4f}" for x in b))
        print(f"dlm max relative loss difference DP2 vs 1 GPU: {worst:.2e}")
    for n in ("dlm_1gpu", "dlm_dp2"):
        r = runs[n]
        if r:
            p = r["plan"]
            print(f"{n}: device in use {r['device_used_gib']:.2f} GiB, model's buffers {r['model_gib']:.2f} GiB, "
                  f"plan {r['plan_gib']:.2f} GiB (weights {p['weights']:.2f} + grads {p['gradients']:.2f} + optimizer "
                  f"{p['optimizer']:.2f} + activations {p['activations']:.2f}): plan / in use = "
                  f"{r['plan_gib'] / r['device_used_gib']:.3f}, plan / model = {r['plan_gib'] / r['model_gib']:.3f}")


if __name__ == "__main__":
    main()
