#!/usr/bin/env bash
# On a machine with 2 GPUs, in the repository root: dlm's model-parallel layouts on the GPUs.
#   1. tests/nccl/cuda_model_parallel_test.cpp over NCCL (TP2, TP2+SP, PP2 against the whole model);
#   2. dlm-train --device cuda on the 350M shape (seq 2048, micro-batch 8, global batch 32, 30 iterations) on
#      one GPU, then under mpirun -np 2 as DP2, DP2 with the distributed optimizer, TP2+SP and PP2: each layout's losses against the one-GPU curve,
#      tokens/s per GPU beside one GPU's, and each rank's peak device memory (nvidia-smi, sampled) beside
#      `dlm-train --dry-run`'s plan for the same flags;
#   3. a SIGKILLed rank of a TP2+SP run must end the job naming it.
# The PyTorch reference of the same layouts: benchmarks/parallel/device_dp.sh ... torch,torchtp,torchpp.
# usage: scripts/device-mp2.sh [CARRIED_DIR=build-cuda/devcarry]   (scripts/device-pack.sh builds the bundle;
# the data is $DLM_GPU_DATA, default .gpudata/corpus_text_document, copied to the machine). Logs under $OUT.
set -uo pipefail
C=${1:-build-cuda/devcarry}
OUT=${OUT:-/tmp/dlm-out}
source "$(dirname "$0")/device-common.sh"
date -u | tee "$OUT/mp2-date.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

echo "== CudaModel layouts over NCCL (tests/nccl)"
timeout 300 "${MPI2[@]}" "$C/dlm_cuda_parallel_tests" > "$OUT/cuda_parallel_tests.log" 2>&1; echo "exit $?"
grep -E "gpu layouts\]|FAILED|Failure|Expected|Which is|passed" "$OUT/cuda_parallel_tests.log" | head -40

flags=("${FLAGS_350M[@]}")
timeout 120 "$C/dlm-train" "${flags[@]}" --train-iters 1 > /dev/null 2>&1  # index caches

# NAME NP LAYOUT-FLAGS...: a 30-iteration run with its metrics and each GPU's peak memory in use.
run() {
  local name=$1 np=$2; shift 2
  echo "== $name"
  ( while true; do nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits; sleep 0.5; done ) \
    > "$OUT/$name.mem" 2>/dev/null &
  local sampler=$!
  if [ "$np" = 1 ]; then
    timeout 300 "$C/dlm-train" "${flags[@]}" "$@" --train-iters 30 --metrics-file "$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1
  else
    timeout 300 "${MPI2[@]}" "$C/dlm-train" "${flags[@]}" "$@" --train-iters 30 --metrics-file "$OUT/$name.jsonl" \
      > "$OUT/$name.log" 2>&1
  fi
  echo "exit $?"; kill $sampler 2>/dev/null
  grep -E "error|Error|iteration +30/" "$OUT/$name.log" | tail -3
  "$C/dlm-train" "${flags[@]}" "$@" --world-size "$np" --train-iters 30 --dry-run > "$OUT/$name.plan" 2>&1
  grep -E "^stage|^ +[0-9]+ +[0-9]" "$OUT/$name.plan" | head -4
}
run one_gpu 1
run dp2 2
run dp2do 2 --use-distributed-optimizer
run tp2sp 2 --tensor-model-parallel-size 2 --sequence-parallel
run pp2 2 --pipeline-model-parallel-size 2

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def losses(name):
    rows = [json.loads(l) for l in open(os.path.join(out, name + ".jsonl")) if l.strip()]
    return [r for r in rows if "loss" in r]
def peak(name):
    most = {}
    for line in open(os.path.join(out, name + ".mem")):
        try:
            gpu, used = (int(x) for x in line.split(","))
        except ValueError:
            continue
        most[gpu] = max(most.get(gpu, 0), used)
    return " / ".join(f"{most[g] / 1024:.2f}" for g in sorted(most))
base = losses("one_gpu")
tps1 = sum(r["tokens_per_second"] for r in base[2:]) / len(base[2:])
print(f"{'layout':8} {'tokens/s':>10} {'per GPU':>9} {'vs 1 GPU':>8} {'max loss rel':>12}  peak GiB in use per GPU")
for name in ["one_gpu", "dp2", "dp2do", "tp2sp", "pp2"]:
    try:
        rows = losses(name)
    except OSError:
        print(f"{name:8} (no metrics)"); continue
    tps = sum(r["tokens_per_second"] for r in rows[2:]) / max(1, len(rows[2:]))
    gpus = 1 if name == "one_gpu" else 2
    worst = max((abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(base, rows)), default=float("nan"))
    print(f"{name:8} {tps:10.0f} {tps / gpus:9.0f} {tps / gpus / tps1:8.3f} {worst:12.2e}  {peak(name)}")
    print("   losses:", [round(r["loss"], 4) for r in rows])
PY

echo "== SIGKILL of rank 1 of a TP2+SP run (timeout 0.2 min)"
kill_rank_one_midrun "$OUT/kill-tp.log" --tensor-model-parallel-size 2 --sequence-parallel
