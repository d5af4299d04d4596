#!/usr/bin/env bash
# On a machine with 2 GPUs, in the repository root: dlm-train --device cuda on one GPU and
# under `mpirun -np 2` (data parallelism over NCCL) on the 350M shape, same flags and data: the two loss
# curves (equal within bf16 noise), tokens/s per GPU and the DP2 / 1-GPU ratio; then a rank SIGKILLed
# mid-run must make the job exit non-zero within --distributed-timeout-minutes naming it; and a DP2 run
# killed after a checkpoint resumes from `latest` on the straight run's losses (deterministic mode, so
# equal to the last digit). Logs under $OUT.
# usage: scripts/device-dp2.sh [CARRIED_DIR=build-cuda/devcarry]   (scripts/device-pack.sh builds the bundle;
# the data is $DLM_GPU_DATA, default .gpudata/corpus_text_document, copied to the machine)
set -uo pipefail
C=${1:-build-cuda/devcarry}
OUT=${OUT:-/tmp/dlm-out}
source "$(dirname "$0")/device-common.sh"
date -u | tee "$OUT/dp2-date.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
flags=("${FLAGS_350M[@]}")
# Index caches first (rank 0 of the mpirun job would build them too; one process here keeps the timing clean).
timeout 120 "$C/dlm-train" "${flags[@]}" --train-iters 1 > /dev/null 2>&1
echo "== one GPU, 30 iterations"
timeout 300 "$C/dlm-train" "${flags[@]}" --train-iters 30 --metrics-file "$OUT/dp1.jsonl" 2>&1 | tail -4
echo "== DP2 over NCCL, 30 iterations"
timeout 300 "${MPI2[@]}" "$C/dlm-train" "${flags[@]}" \
  --train-iters 30 --metrics-file "$OUT/dp2.jsonl" 2>&1 | tail -6
python3 - "$OUT/dp1.jsonl" "$OUT/dp2.jsonl" <<'PY'
import json, sys
def read(p):
    rows = [json.loads(l) for l in open(p) if l.strip()]
    return [r for r in rows if "loss" in r]
a, b = read(sys.argv[1]), read(sys.argv[2])
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
print("iterations logged:", len(a), len(b))
print("losses 1 GPU:", [round(r["loss"], 4) for r in a])
print("losses DP2  :", [round(r["loss"], 4) for r in b])
print(f"max relative loss difference DP2 vs 1 GPU: {worst:.2e}")
# tokens/s from the last windows (the first includes start-up); DP2's is the whole job's
ta = sum(r["tokens_per_second"] for r in a[2:]) / len(a[2:]); tb = sum(r["tokens_per_second"] for r in b[2:]) / len(b[2:])
print(f"tokens/s: 1 GPU {ta:.0f}, DP2 {tb:.0f} ({tb / 2:.0f} per GPU), DP2 / 1 GPU = {tb / ta:.2f}x")
PY
echo "== SIGKILL of rank 1 mid-run (timeout 0.2 min)"
kill_rank_one_midrun "$OUT/kill.log"
echo "== SIGKILL after a checkpoint, then resume (--deterministic-mode, 30 iterations, a save every 5)"
timeout 300 "${MPI2[@]}" "$C/dlm-train" \
  "${flags[@]}" --deterministic-mode --train-iters 30 --metrics-file "$OUT/straight.jsonl" > /dev/null 2>&1
rm -rf /tmp/ckpt-dp2
( timeout 300 "${MPI2[@]}" "$C/dlm-train" \
    "${flags[@]}" --deterministic-mode --train-iters 30 --save /tmp/ckpt-dp2 --save-interval 5 --distributed-timeout-minutes 0.2 \
    > "$OUT/kill2.log" 2>&1; echo "job exit $?" >> "$OUT/kill2.log" ) &
for i in $(seq 1 600); do grep -q "iteration *10/" "$OUT/kill2.log" 2>/dev/null && break; sleep 0.2; done
victim=$(pgrep -f "dlm-train .*--save /tmp/ckpt-dp2" | while read p; do
  if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then echo $p; fi; done | head -1)
kill -9 "$victim"; wait
echo "killed rank 1 (pid $victim); latest: $(cat /tmp/ckpt-dp2/latest 2>/dev/null)"; tail -1 "$OUT/kill2.log"
timeout 300 "${MPI2[@]}" "$C/dlm-train" \
  "${flags[@]}" --deterministic-mode --train-iters 30 --load /tmp/ckpt-dp2 --metrics-file "$OUT/resumed.jsonl" 2>&1 | grep -E "resuming|final" | tail -2
python3 - "$OUT/straight.jsonl" "$OUT/resumed.jsonl" <<'PY'
import json, sys
def read(p):
    return {r["iteration"]: r["loss"] for r in (json.loads(l) for l in open(p) if l.strip()) if "loss" in r}
a, b = read(sys.argv[1]), read(sys.argv[2])
common = sorted(set(a) & set(b))
print("resumed iterations logged:", common)
for i in common: print(f"  iteration {i}: straight {a[i]:.6f} resumed {b[i]:.6f}")
print("resumed losses equal to the straight run's:", all(a[i] == b[i] for i in common) and len(common) > 0)
PY
