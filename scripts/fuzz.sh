#!/usr/bin/env bash
# Builds every libFuzzer target with clang under ASan+UBSan and runs each for SECONDS (default 600).
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]     logs: build-fuzz/logs/<target>.log
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLM_FUZZ=ON \
  -DDLM_SANITIZE=ON -DDLM_CUDA=OFF -DDLM_BENCHMARKS=OFF -DDLM_PYTHON="$PWD/.venv/bin/python" > /dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cd tests/fuzz && ls *_fuzz.cpp | sed 's/\.cpp$//')
fi
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"
mkdir -p build-fuzz/logs
for t in "${targets[@]}"; do
  name=${t%_fuzz}
  corpus=build-fuzz/corpus/$name
  mkdir -p "$corpus"
  seeds=tests/fuzz/corpus/$name
  [ -d "$seeds" ] || seeds=""
  echo "fuzz: $t for ${seconds}s"
  ./build-fuzz/tests/fuzz/"$t" -max_total_time="$seconds" -print_final_stats=1 "$corpus" $seeds \
    > build-fuzz/logs/"$t".log 2>&1 || { echo "fuzz: $t FOUND A CRASH: see build-fuzz/logs/$t.log"; exit 1; }
  grep -E "stat::number_of_executed_units|Done" build-fuzz/logs/"$t".log | tail -2
done
