#!/usr/bin/env bash
# On the GPU machine, in the repository root: FP8 training (issue 32). The GPU tests of the FP8 GEMMs, casts and the
# FP8 model (with the bf16 GEMM and parity tests beside them), then one benchmark run of dlm FP8 (tensorwise and
# delayed) and dlm bf16 beside PyTorch bf16 and torchao float8 (tensorwise, rowwise), all torch.compile, on each
# configuration (benchmarks/train/compare_fp8.py). Logs under $OUT.
# usage: scripts/device-fp8.sh [CARRIED_DIR=build-cuda/devcarry] [CONFIGS=350m,megadlm-1.7b] [WHAT=tests,bench]
# CARRIED_DIR: scripts/device-pack.sh's output (bundle.tar.xz). torchao is not on the machine: its wheel
# (torchao==0.18.0, cp310-abi3, fetched with `pip download torchao==0.18.0 --no-deps --only-binary :all: -d
# build-cuda/wheels`) is carried in $WHEELS and installed with --no-deps into a folder on PYTHONPATH.
# One device command may run 10 minutes: the tests (the FP8 ones, the FP8 layouts on 2 ranks, then the rest of
# dlm_gpu_tests) and each configuration's comparison fit one call each, e.g.
#   scripts/device-fp8.sh build-cuda/devcarry 350m tests      (carry build-cuda/devcarry)
#   scripts/device-fp8.sh build-cuda/devcarry 350m bench      (carry build-cuda/devcarry and build-cuda/wheels)
#   scripts/device-fp8.sh build-cuda/devcarry megadlm-1.7b bench
# STEPS (default 10): timed steps of every peer; ACCUMULATE (default 1): micro-batches per step (compare_fp8.py).
set -uo pipefail
C=${1:-build-cuda/devcarry}
CONFIGS=${2:-350m,megadlm-1.7b}
WHAT=${3:-tests,bench}
WHEELS=${WHEELS:-build-cuda/wheels}
STEPS=${STEPS:-10}
ACCUMULATE=${ACCUMULATE:-1}
OUT=${OUT:-/tmp/dlm-out}
HERE=$PWD
# The bundle unpacked into C and the libraries' path (device-common.sh; its MPI settings go unused here).
source "$(dirname "$0")/device-common.sh"
PY=/opt/torch/.venv/bin/python
[ -x $PY ] || PY=python3
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
date -u | tee "$OUT/date.txt"
if [[ $WHAT == *tests* ]]; then
  echo "== FP8 GPU tests (tests/gpu/cuda_fp8_test.cpp, cuda_fp8_model_test.cpp) and the bf16 GEMM test"
  timeout 480 "$C/dlm_gpu_tests" --gtest_filter='Fp8*:CudaFp8*:Gemm.*' > "$OUT/fp8_tests.log" 2>&1
  echo "dlm_gpu_tests (FP8) exit $?"
  grep -E "^\[  (FAILED|PASSED) |OK \]|FAILED|Failure|Expected|Which is|actual|\[fp8 " "$OUT/fp8_tests.log" | head -120
  echo "== FP8 under TP2+SP and PP2 against the whole model's FP8 (2 ranks sharing the GPU, groups staged through MPI)"
  timeout 300 "${MPI2[@]}" "$C/dlm_cuda_parallel_tests" --gtest_filter='CudaModelParallel.Fp8*' \
    > "$OUT/fp8_layouts.log" 2>&1; echo "exit $?"
  grep -E "gpu layouts\]|FAILED|Failure|Expected|Which is|PASSED" "$OUT/fp8_layouts.log" | head -20
  echo "== the rest of the GPU tests (the bf16 path must be unchanged)"
  timeout 480 "$C/dlm_gpu_tests" --gtest_filter='-Fp8*:CudaFp8*' > "$OUT/gpu_tests.log" 2>&1
  echo "dlm_gpu_tests (others) exit $?"
  grep -E "^\[  (FAILED|PASSED) |FAILED|Failure" "$OUT/gpu_tests.log" | head -40
fi
if [[ $WHAT == *bench* ]]; then
  echo "== torchao $(ls $WHEELS/torchao-*.whl 2>/dev/null)"
  rm -rf /tmp/torchao && $PY -m pip install -q --no-deps --target /tmp/torchao $WHEELS/torchao-*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/torchao${PYTHONPATH:+:$PYTHONPATH}
  $PY -c "import torch, torchao; print('torch', torch.__version__, 'torchao', torchao.__version__)"
  echo "== dlm FP8 / dlm bf16 / PyTorch bf16 / torchao float8 ($CONFIGS, $STEPS timed steps of $ACCUMULATE micro-batches each)"
  cd "$HERE/benchmarks/train" && $PY compare_fp8.py --bench "$(realpath $C)/cuda_train_bench" --configs "$CONFIGS" \
    --steps "$STEPS" --accumulate "$ACCUMULATE" --python "$PY" 2>&1 | tee "$OUT/fp8_bench.log" | grep -vE "^\s*$" | tail -40
  cd "$HERE"
  echo "== FP8 GEMMs beside bf16 at the step's shapes, the casts' bandwidth (benchmarks/train/fp8_bench.cpp)"
  timeout 120 "$C/fp8_bench" > "$OUT/fp8_kernels.log" 2>&1; echo "exit $?"
  cat "$OUT/fp8_kernels.log"
  echo "== the FP8 step's phases (350m, tensorwise)"
  timeout 180 "$C/cuda_train_bench" --profile --fp8 tensorwise 350m 5 2 > "$OUT/fp8_profile.log" 2>&1; echo "exit $?"
  tail -40 "$OUT/fp8_profile.log"
fi
