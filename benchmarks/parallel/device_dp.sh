#!/usr/bin/env bash
# On a machine with 2 GPUs, in the repository root: the NCCL communicator tests, dlm's data
# parallelism (dp_bench) on 1 GPU and DP2 with and without overlap, PyTorch DDP + torch.compile on 1 and 2 GPUs
# at the same global batch, then a rank SIGKILLed during a DP2 run. Logs under $OUT.
# torchtp / torchpp: PyTorch TP2 + sequence parallelism / PP2 (1F1B) on the 2 GPUs (torch_mp.py), rerun once with
# --no-compile if the compiled run fails (the JSON's "compile" says which ran).
# usage: benchmarks/parallel/device_dp.sh [CARRIED=build-nccl/devcarry] [CONFIG=350m] [GLOBAL_BATCH=32] [WHAT]
# WHAT: comma-separated words of tests, dlm, torch, torchtp, torchpp, kill (default tests,dlm,torch,kill)
# (benchmarks/parallel/pack.sh fills CARRIED on the machine that builds dlm)
set -uo pipefail
C=${1:-build-nccl/devcarry}
CONFIG=${2:-350m}
G=${3:-32}
WHAT=${4:-tests,dlm,torch,kill}
OUT=${OUT:-/tmp/dlm-out}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
PY=${PY:-python3}
[ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python
export LD_LIBRARY_PATH=$(realpath "$C")/lib:$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr '\n' ':')/usr/local/cuda/lib64
# NVLink multicast stays off (on a shared NVLink host it can take the host's GPUs out of service); mpirun passes
# these on with -x.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
MPI=(mpirun --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
date -u | tee "$OUT/date.txt"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi topo -m 2>&1 | head -4 | tee -a "$OUT/gpu.txt"

want() { [[ ,${WHAT// /,}, == *,$1,* ]]; }  # whole words: "torch" is not in "torchtp"

if want tests; then
echo "== NCCL communicator tests (2 ranks)"
timeout 180 "${MPI[@]}" -np 2 "$C/dlm_nccl_tests" > "$OUT/nccl_tests.log" 2>&1
echo "exit $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|Failure|Expected|Which is|\[timeout\]|tests passed|TESTS FAILED" "$OUT/nccl_tests.log" | head -40
fi

bench() {  # NAME NP ARGS...
  local name=$1 np=$2; shift 2
  echo "== dlm $name"
  timeout 240 "${MPI[@]}" -np "$np" "$C/dp_bench" --config "$CONFIG" --global-batch "$G" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "exit $?"; tail -2 "$OUT/$name.err"; tail -1 "$OUT/$name.json"
}
if want dlm; then
  bench dlm_1gpu 1
  bench dlm_dp2 2
  bench dlm_dp2_nooverlap 2 --no-overlap
fi

torch_run() {  # NAME NP TIMEOUT SCRIPT [ARGS...]
  local name=$1 np=$2 limit=$3 script=$4; shift 4
  echo "== torch $name $*"
  timeout "$limit" $PY -m torch.distributed.run --standalone --nproc_per_node "$np" "benchmarks/parallel/$script" \
    --config "$CONFIG" --global-batch "$G" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  local rc=$?
  echo "exit $rc"; grep -vE "Warning|warn|^\s*$" "$OUT/$name.err" | tail -3; tail -1 "$OUT/$name.json"
  return $rc
}
if want torch; then
  torch_run torch_1gpu 1 200 torch_ddp.py
  torch_run torch_dp2 2 200 torch_ddp.py
fi
torch_mp() {  # LAYOUT: compiled, or once more without torch.compile if that run fails (its log kept apart)
  torch_run "torch_$1" 2 240 torch_mp.py --layout "$1" && return
  mv "$OUT/torch_$1.err" "$OUT/torch_$1_compiled.err"
  torch_run "torch_$1" 2 240 torch_mp.py --layout "$1" --no-compile
}
want torchtp && torch_mp tp2sp
want torchpp && torch_mp pp2

echo "== summary"
$PY benchmarks/parallel/summarize.py "$OUT" | tee "$OUT/summary.txt"

want kill || exit 0
echo "== SIGKILL of rank 1 during a DP2 run (--distributed-timeout-minutes 0.25, mpirun --enable-recovery keeps rank 0)"
# Each rank's exit status is printed by a shell around it (mpirun --enable-recovery itself may exit 0).
( timeout 200 "${MPI[@]}" --enable-recovery -np 2 sh -c '"$0" "$@"; echo "rank $OMPI_COMM_WORLD_RANK exit $?" >&2' \
    "$C/dp_bench" --config "$CONFIG" --global-batch "$G" --steps 100000 --distributed-timeout-minutes 0.25 \
    > "$OUT/kill.out" 2> "$OUT/kill.log"; echo "job exit $?" >> "$OUT/kill.log" ) &
job=$!
for i in $(seq 1 120); do grep -q "^step 5 " "$OUT/kill.log" 2>/dev/null && break; sleep 1; done
victim=$(pgrep -x dp_bench | while read -r p; do
  if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then echo "$p"; fi; done | head -1)
t0=$(date +%s.%N)
echo "killing rank 1 (pid $victim) after step 5"
kill -9 "$victim"
wait "$job"
t1=$(date +%s.%N)
grep -vE "^step " "$OUT/kill.log" | tail -12
$PY -c "print(f'job ended {float(\"$t1\") - float(\"$t0\"):.1f} s after the kill (timeout 15 s)')"
