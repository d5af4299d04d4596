#!/usr/bin/env bash
# On a machine with ONE GPU, in the repository root: each rank's peak device memory under dlm's 2-rank layouts
# of the 350M shape (TP2+SP, PP2, DP2 with the distributed optimizer) beside `dlm-train --dry-run`'s plan, the
# two ranks sharing the GPU with their groups staged through MPI (dlm-train --device-groups staged; no NCCL buffers,
# and the speed means nothing). Memory per process from nvidia-smi's compute-apps list, sampled every 0.3 s;
# rank by the process's OMPI_COMM_WORLD_RANK; one_gpu_recompute is the single GPU with --recompute-granularity
# full. The 2-GPU version, with NCCL and timings, is device-mp2.sh.
# usage: scripts/device-mem1.sh [CARRIED_DIR=build-cuda/devcarry [LAYOUTS=one_gpu,one_gpu_recompute,tp2sp,pp2,dp2do]]
# (data: $DLM_GPU_DATA, copied to the machine). Logs in $OUT.
set -uo pipefail
C=${1:-build-cuda/devcarry}
LAYOUTS=${2:-one_gpu,one_gpu_recompute,tp2sp,pp2,dp2do}
OUT=${OUT:-/tmp/dlm-out}
source "$(dirname "$0")/device-common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
flags=("${FLAGS_350M[@]}")
timeout 60 "$C/dlm-train" "${flags[@]}" --train-iters 1 > /dev/null 2>&1  # index caches

# NAME NP LAYOUT-FLAGS...: 3 iterations (45 s at most), each process's peak memory, and the plan.
run() {
  local name=$1 np=$2; shift 2
  [[ ",$LAYOUTS," == *",$name,"* ]] || return 0
  ( while true; do
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | while IFS=', ' read -r pid mib; do
        rank=$(tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        echo "${rank:-0} $mib"
      done
      sleep 0.3
    done ) > "$OUT/$name.mem" &
  local sampler=$!
  if [ "$np" = 1 ]; then
    timeout 45 "$C/dlm-train" "${flags[@]}" "$@" --train-iters 3 > "$OUT/$name.log" 2>&1
  else
    timeout 45 "${MPI2[@]}" --oversubscribe "$C/dlm-train" "${flags[@]}" "$@" --device-groups staged \
      --train-iters 3 > "$OUT/$name.log" 2>&1
  fi
  echo "== $name: exit $?"; kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
  grep -E "rror|iteration +[0-9]+/" "$OUT/$name.log" | tail -2
  "$C/dlm-train" "${flags[@]}" "$@" --world-size "$np" --train-iters 3 --dry-run > "$OUT/$name.plan" 2>&1
}
run one_gpu 1
run one_gpu_recompute 1 --recompute-granularity full
run tp2sp 2 --tensor-model-parallel-size 2 --sequence-parallel
run pp2 2 --pipeline-model-parallel-size 2
run dp2do 2 --use-distributed-optimizer

python3 - "$OUT" <<'PY'
import os, re, sys
out = sys.argv[1]
def peaks(name):
    most = {}
    for line in open(os.path.join(out, name + ".mem")):
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            r = int(parts[0]) if parts[0].isdigit() else 0
            most[r] = max(most.get(r, 0), int(parts[1]))
    return {r: mib / 1024 for r, mib in most.items()}
def plan(name):
    per_rank = {}
    for line in open(os.path.join(out, name + ".plan")):
        f = line.split()
        if len(f) >= 9 and f[0].isdigit() and re.fullmatch(r"\d+(-\d+)?", f[1]):
            lo, _, hi = f[1].partition("-")
            for r in range(int(lo), int(hi or lo) + 1):
                per_rank[r] = float(f[8])
    return per_rank
print(f"{'layout':8} {'rank':>4} {'measured GiB':>12} {'plan GiB':>9} {'plan/measured':>13}")
for name in ["one_gpu", "one_gpu_recompute", "tp2sp", "pp2", "dp2do"]:
    try:
        got, want = peaks(name), plan(name)
    except OSError as e:
        print(f"{name:8} ({e})"); continue
    for r in sorted(want):
        m = got.get(r)
        print(f"{name:8} {r:4d} {m if m else float('nan'):12.2f} {want[r]:9.2f} {want[r] / m if m else float('nan'):13.3f}")
PY
