#!/usr/bin/env bash
# On a GPU machine, in the repository root: dlm-train --device cuda launched by torchrun (the ranks meet in the
# c10d store of torchrun's agent; host collectives over Gloo, no MPI) against the same command under
# mpirun -np 2, on the 350M shape cut to 4 layers and sequences of 256, 10 iterations, --deterministic-mode: the per-iteration losses
# of the metrics files must be equal, digit for digit.
#   one GPU: two ranks share it, their device groups staged through the host (--device-groups staged, as
#            tests/gpu's layout tests run): TP2+SP, and DP2 with the distributed optimizer;
#   two GPUs or more: also DP2 over NCCL, whose unique id goes through the store under torchrun;
# and tests/nccl's CudaModel layouts (dlm_cuda_parallel_tests) run under torchrun.
# Exits non-zero on any mismatch or failed run. torchrun is /opt/torch/.venv's (TORCHRUN overrides).
# usage: scripts/device-torchrun.sh [CARRIED_DIR=build-cuda/devcarry]   (scripts/device-pack.sh builds the bundle;
# the data is $DLM_GPU_DATA, default .gpudata/corpus_text_document, copied to the machine). Logs under $OUT.
set -uo pipefail
C=${1:-build-cuda/devcarry}
OUT=${OUT:-/tmp/dlm-out}
source "$(dirname "$0")/device-common.sh"
TORCHRUN=${TORCHRUN:-/opt/torch/.venv/bin/torchrun}
date -u | tee "$OUT/torchrun-date.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
export OMP_NUM_THREADS=1  # as torchrun sets it for its workers, so both launchers run the same host threads
# Short sequences and batches: the staged groups move every activation through host memory (a test path, ~10 s an
# iteration at the full 350M batch).
flags=("${FLAGS_350M[@]}" --num-layers 4 --seq-length 256 --micro-batch-size 2 --global-batch-size 8 --train-iters 10
       --log-interval 1 --deterministic-mode)
timeout 120 "$C/dlm-train" "${flags[@]}" --train-iters 1 > /dev/null 2>&1  # index caches

status=0
# NAME LAYOUT-FLAGS...: the same command under mpirun -np 2 and torchrun --nproc_per_node 2; their losses compared.
compare() {
  local name=$1; shift
  echo "== $name"
  timeout ${RUN_TIMEOUT:-300} "${MPI2[@]}" "$C/dlm-train" "${flags[@]}" "$@" --metrics-file "$OUT/$name-mpirun.jsonl" \
    > "$OUT/$name-mpirun.log" 2>&1
  local rc=$?
  echo "mpirun exit $rc"
  [ $rc = 0 ] || tail -n 8 "$OUT/$name-mpirun.log"
  timeout ${RUN_TIMEOUT:-300} "$TORCHRUN" --no-python --nproc_per_node 2 "$C/dlm-train" "${flags[@]}" "$@" \
    --metrics-file "$OUT/$name-torchrun.jsonl" > "$OUT/$name-torchrun.log" 2>&1
  rc=$?
  echo "torchrun exit $rc"
  [ $rc = 0 ] || tail -n 8 "$OUT/$name-torchrun.log"
  grep -E "ranks \(torchrun\)|error|Error" "$OUT/$name-torchrun.log" | head -3
  python3 - "$OUT/$name-mpirun.jsonl" "$OUT/$name-torchrun.jsonl" <<'PY' || status=1
import re, sys
def losses(path):
    try:
        return [m.group(1) for l in open(path) for m in [re.search(r'"loss": ([^,}]+)', l)] if m]
    except OSError:
        return []
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print("mpirun  ", " ".join(a))
print("torchrun", " ".join(b))
ok = len(a) == 10 and a == b
print("EQUAL" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
PY
}
if [ -z "${SKIP_LAYOUTS:-}" ]; then  # SKIP_LAYOUTS=1: only the dlm-train comparisons
  echo "== CudaModel layouts (tests/nccl) under torchrun: groups staged through Gloo on one GPU, NCCL with two"
  timeout 300 "$TORCHRUN" --no-python --nproc_per_node 2 "$C/dlm_cuda_parallel_tests" > "$OUT/torchrun-cuda-parallel.log" 2>&1
  echo "exit $?"
  grep -E "gpu layouts\]|FAILED|Failure|Expected|Which is|passed" "$OUT/torchrun-cuda-parallel.log" | head -20
  grep -q "mpi tests passed on 2 ranks" "$OUT/torchrun-cuda-parallel.log" || status=1
fi
compare tp2sp-staged --tensor-model-parallel-size 2 --sequence-parallel --device-groups staged
compare dp2do-staged --use-distributed-optimizer --device-groups staged
if [ "$gpus" -ge 2 ]; then
  compare dp2-nccl
else
  echo "== dp2-nccl: skipped ($gpus GPU; NCCL takes one GPU per rank)"
fi
echo "device-torchrun: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
