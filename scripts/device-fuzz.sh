#!/usr/bin/env bash
# On a many-core machine, in the repository root: every libFuzzer target copied into
# DIR (built by scripts/fuzz.sh's configuration, debug info stripped, with the shared libraries the
# machine lacks in DIR/lib) runs SECONDS at once, one core each, seeded from tests/fuzz/corpus/<name>.
# Logs and any crash land under $OUT, with the grown corpora as $OUT/corpus.tar.gz; a later run continues
# from them when given that archive (to split a long fuzzing time over several runs).
# usage: scripts/device-fuzz.sh DIR [SECONDS=600] [CORPUS.tar.gz]
set -uo pipefail
D=$1
SECONDS_EACH=${2:-600}
OUT=${OUT:-/tmp/dlm-fuzz-out}
mkdir -p "$OUT"
[ -n "${3:-}" ] && [ -f "$3" ] && mkdir -p /tmp/corpus && tar -C /tmp/corpus -xzf "$3"
export LD_LIBRARY_PATH=$PWD/$D/lib
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
date -u | tee "$OUT/date.txt"
nproc
pids=()
for bin in "$D"/*_fuzz; do
  t=$(basename "$bin"); name=${t%_fuzz}
  mkdir -p "/tmp/corpus/$name"
  seeds=tests/fuzz/corpus/$name; [ -d "$seeds" ] || seeds=""
  "$bin" -max_total_time="$SECONDS_EACH" -print_final_stats=1 -rss_limit_mb=4096 -artifact_prefix="$OUT/$t-" \
    "/tmp/corpus/$name" $seeds > "$OUT/$t.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
for log in "$OUT"/*_fuzz.log; do
  t=$(basename "$log" .log)
  runs=$(grep -Eo 'stat::number_of_executed_units: [0-9]+' "$log" | grep -Eo '[0-9]+$')
  if grep -qE "ERROR: (AddressSanitizer|libFuzzer)|runtime error:|deadly signal" "$log"; then
    echo "$t: FINDING (see $t.log)"; status=1
  else
    echo "$t: clean, ${runs:-?} executions in ${SECONDS_EACH} s"
  fi
done
tar -C /tmp/corpus -czf "$OUT/corpus.tar.gz" .
# At most 8 files come back from the device: the logs and any crash inputs travel as one archive.
(cd "$OUT" && tar -czf fuzz-logs.tar.gz *_fuzz.log $(ls | grep -- '-crash-\|-leak-\|-timeout-\|-oom-') && rm -f *_fuzz.log *-crash-* *-leak-* *-timeout-* *-oom-*)
exit $status
