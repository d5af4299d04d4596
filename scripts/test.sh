#!/usr/bin/env bash
# Set-up command 2: installs, builds and runs the whole test suite:
#   1. the Release build's tests, every label (unit, interop, mpi; gpu tests skip without a GPU),
#   2. the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
JOBS=${JOBS:-$(nproc)}
(cd build && ctest --output-on-failure -j "$JOBS" --timeout 1500)

# Sanitizers: unit tests only (the interop peers are Python; the CUDA backend is not built here).
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDLM_SANITIZE=ON -DDLM_CUDA=OFF \
  -DDLM_BENCHMARKS=OFF -DDLM_PYTHON="$PWD/.venv/bin/python"
cmake --build build-asan -j "$JOBS"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j "$JOBS" -L unit -E install_ --timeout 1500)
