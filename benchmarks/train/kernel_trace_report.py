#!/usr/bin/env python3
"""Where a replayed CUDA graph's time goes, from a kernel trace (kernel_trace.cpp's CSV).

The graph with the most kernel launches is taken (a sampler's window step, replayed hundreds of times); its replays
are cut at its first node, and for each kernel name the median duration and the median idle time before it are
summed over a replay. Usage: kernel_trace_report.py TRACE.csv [--nodes N] (N: also list the first N nodes)."""
import argparse
import collections
import csv
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace")
    ap.add_argument("--nodes", type=int, default=0, help="list the first N nodes of a replay")
    args = ap.parse_args()
    with open(args.trace) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("start_ns", "end_ns", "graph_id", "graph_node", "grid", "block"):
            r[k] = int(r[k])
    rows.sort(key=lambda r: r["start_ns"])
    by_graph = collections.defaultdict(list)
    for r in rows:
        if r["graph_id"]:
            by_graph[r["graph_id"]].append(r)
    if not by_graph:
        raise SystemExit(f"{args.trace}: no kernel of a CUDA graph")
    kernels = by_graph[max(by_graph, key=lambda g: len(by_graph[g]))]
    head = kernels[0]["graph_node"]
    replays, current = [], []
    for r in kernels:
        if r["graph_node"] == head and current:
            replays.append(current)
            current = []
        current.append(r)
    replays.append(current)
    n = collections.Counter(len(x) for x in replays).most_common(1)[0][0]
    replays = [x for x in replays if len(x) == n][1:]  # the first replay warms up
    if not replays:
        raise SystemExit(f"{args.trace}: fewer than two whole replays")
    dur = [statistics.median(x[i]["end_ns"] - x[i]["start_ns"] for x in replays) / 1e3 for i in range(n)]
    gap = [0.0] + [statistics.median(x[i]["start_ns"] - x[i - 1]["end_ns"] for x in replays) / 1e3
                   for i in range(1, n)]
    span = statistics.median(x[-1]["end_ns"] - x[0]["start_ns"] for x in replays) / 1e3
    print(f"{len(replays)} replays of {n} kernels: {span:.1f} us a replay, kernels {sum(dur):.1f} us, "
          f"idle between them {sum(gap):.1f} us")
    names = collections.OrderedDict()
    for i in range(n):
        c = names.setdefault(replays[0][i]["name"], [0, 0.0, 0.0])
        c[0] += 1
        c[1] += dur[i]
        c[2] += gap[i]
    print(f"{'count':>5} {'us each':>8} {'idle before':>11} {'us a replay':>11}  kernel")
    for name, (count, d, g) in sorted(names.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
        print(f"{count:5d} {d / count:8.2f} {g / count:11.2f} {d + g:11.1f}  {name[:90]}")
    for i in range(min(n, args.nodes)):
        r = replays[0][i]
        print(f"node {i:3d} grid {r['grid']:5d} block {r['block']:4d} {dur[i]:7.2f} us (idle {gap[i]:5.2f})  "
              f"{r['name'][:70]}")


if __name__ == "__main__":
    main()
