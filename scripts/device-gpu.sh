#!/usr/bin/env bash
# On the GPU machine, in the repository root: the GPU tests, the CPU-parity tests and the training benchmark
# beside PyTorch, logs under $OUT. The binaries are built on the workstation and carried (scripts/device-pack.sh).
# usage: scripts/device-gpu.sh [CARRIED_DIR=build-cuda/devcarry] [CONFIGS=350m,qwen3-1.7b]
set -uo pipefail
C=${1:-build-cuda/devcarry}
CONFIGS=${2:-350m,qwen3-1.7b}
OUT=${OUT:-/tmp/dlm-out}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$PWD/$C/lib:$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr '\n' ':')/usr/local/cuda/lib64
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
echo "== tests"
"$C/dlm_gpu_smoke_tests" 2>&1 | tail -3
timeout 300 "$C/dlm_gpu_tests" 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[  (FAILED|PASSED) |OK \]|FAILED|Failure|Expected|Which is|actual|cosine|error" | head -80
echo "== benchmark"
python3 benchmarks/train/compare.py --bench "$C/cuda_train_bench" --configs "$CONFIGS" 2>&1 | tee "$OUT/bench.log" | grep -vE "^\s*$" | tail -40
