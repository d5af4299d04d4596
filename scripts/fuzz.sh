#!/usr/bin/env bash
# Builds every libFuzzer target with clang under ASan+UBSan (libraries instrumented for coverage) and
# runs each for SECONDS (default 600), FUZZ_JOBS at a time (default 1), at low CPU priority.
# usage: [FUZZ_JOBS=N] scripts/fuzz.sh [SECONDS] [TARGET...]
# logs: build-fuzz/logs/<target>.log; crashes: build-fuzz/crashes/<target>-crash-*; exit 1 on any finding.
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
cmake --build build-fuzz -j "${BUILD_JOBS:-2}" --target "${targets[@]}"
mkdir -p build-fuzz/logs build-fuzz/crashes

run_one() {
  local t=$1 seconds=$2 name=${1%_fuzz}
  local corpus=build-fuzz/corpus/$name seeds=tests/fuzz/corpus/$name
  mkdir -p "$corpus"
  [ -d "$seeds" ] || seeds=""
  echo "fuzz: $t for ${seconds}s: build-fuzz/tests/fuzz/$t -max_total_time=$seconds -rss_limit_mb=4096 $corpus $seeds"
  if nice -n 19 ./build-fuzz/tests/fuzz/"$t" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=4096 \
       -artifact_prefix=build-fuzz/crashes/"$t"- "$corpus" $seeds > build-fuzz/logs/"$t".log 2>&1; then
    echo "fuzz: $t ok, $(grep -Eo 'stat::number_of_executed_units: [0-9]+' build-fuzz/logs/"$t".log)"
  else
    echo "fuzz: $t FOUND A CRASH: see build-fuzz/logs/$t.log"
    return 1
  fi
}
export -f run_one
printf '%s\n' "${targets[@]}" | xargs -P "${FUZZ_JOBS:-1}" -I{} bash -c "run_one {} $seconds"
