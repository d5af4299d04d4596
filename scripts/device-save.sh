#!/usr/bin/env bash
# On the GPU machine, in the repository root: checkpoint saving of the MegaDLMs 1.7B shape (28 layers, hidden 2048,
# FFN 6144, 16 heads, vocabulary 50304, untied output layer: 1.733B parameters, 20.8 GB of fp32 weights + AdamW moments) on the
# disk the checkpoints go to (SAVE_DIR), with a summary table at the end:
#   1. the disk's own O_DIRECT rate (dd bs=64M oflag=direct conv=fsync) and a blocking save of the same state from
#      host memory (save_bench: the trainer's save path, its dd in the same run) -> ratio;
#   2. dlm-train --device cuda: a blocking save, then --async-save: the pause at the save point, the background
#      write's rate, the step time of the steps during the background write against the steps before, and the
#      mean step time over a save window of WINDOW steps (default 10: iterations 30..39, the save point's pause
#      after iteration 30 counted in) against the mean of the steps without saving (criterion: within 10%);
#   3. --async-save SIGKILLed while the background thread writes iteration 8: `latest` must still name
#      iter_0000004, and dlm-train --load must resume from it.
# The binaries come from scripts/device-pack.sh (bundle.tar.xz); the data is the .gpudata corpus
# (scripts/dev/make_gpudata.py). About 6-8 minutes; at most 2 checkpoints (42 GB) on the disk at once.
# usage: scripts/device-save.sh [CARRIED_DIR=build-cuda/devcarry]
set -uo pipefail
C=${1:-build-cuda/devcarry}
OUT=${OUT:-/tmp/dlm-out}
S=${SAVE_DIR:-/tmp/dlm-save}
PARTS=${PARTS:-1,2a,2b,3}  # which of the parts below to run (the summary shows nan for the others)
WINDOW=${WINDOW:-10}       # 2b: the steps of the save window (the save point's iteration and those after it)
DD= HOST= SYNC_HELD= SYNC_RATE= ASYNC_HELD= ASYNC_HELD2= ASYNC_RATE= ASYNC_WRITE= BEFORE= DURING= PLAIN_MEAN= WINDOW_MEAN=
KILLED= LATEST= TMP_LEFT= RESUMED=
if [ -f "$C/bundle.tar.xz" ]; then
  mkdir -p /tmp/devcarry && tar -C /tmp/devcarry -xJf "$C/bundle.tar.xz" && C=/tmp/devcarry
fi
mkdir -p "$OUT" "$S"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$(realpath $C)/lib:$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr '\n' ':')/usr/local/cuda/lib64
DATA=${DLM_GPU_DATA:-.gpudata/corpus_text_document}
date -u | tee "$OUT/date.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
df -h "$S" | tail -1 | tee "$OUT/disk.txt"
MODEL=(--num-layers 28 --hidden-size 2048 --ffn-hidden-size 6144 --num-attention-heads 16 --vocab-size 50304
       --mask-token 50303 --qk-layernorm --untie-embeddings-and-output-weights --rotary-base 10000 --norm-epsilon 1e-6 --seq-length 2048
       --max-position-embeddings 2048 --bf16 --lr 2e-4 --device cuda --data-path "$DATA" --split 100,0,0
       --data-cache-path /tmp/dlm-cache --micro-batch-size 4 --global-batch-size 16 --log-interval 1 --seed 3)

if [[ ,$PARTS, == *,1,* ]]; then
  echo "== 1. dd O_DIRECT and a blocking save of 20.8 GB from host memory (save_bench), same disk"
  timeout 200 "$C/save_bench" "$S/bench" --layers 28 2>&1 | tee "$OUT/save_bench.log" | grep layers
  rm -rf "$S/bench"
  field() { grep -o "$2 [0-9.]*" "$1" | head -1 | awk '{print $2}'; }
  DD=$(field "$OUT/save_bench.log" dd_direct_gbps)
  HOST=$(field "$OUT/save_bench.log" save_gbps)

fi
# step_seconds METRICS FIRST LAST [mean [PAUSE]]: the median (or mean) step time of iterations FIRST..LAST (tokens /
# tokens_per_second; a step's time excludes a save point's pause after it); PAUSE seconds are added to the window
# before the mean is taken.
step_seconds() {
  python3 - "$@" <<'EOF'
import json, statistics, sys
path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
how = sys.argv[4] if len(sys.argv) > 4 else "median"
pause = float(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] else 0.0
t = [16 * 2048 / r["tokens_per_second"] for r in map(json.loads, open(path)) if "loss" in r and first <= r["iteration"] <= last]
if not t: print("nan")
elif how == "mean": print(f"{(sum(t) + pause) / len(t):.4f}")
else: print(f"{statistics.median(t):.3f}")
EOF
}

if [[ ,$PARTS, == *,2a,* ]]; then
  echo "== 2a. dlm-train 1.7B, a blocking save after iteration 6"
  rm -rf "$S/sync"
  timeout 240 "$C/dlm-train" "${MODEL[@]}" --train-iters 6 --save "$S/sync" --metrics-file "$OUT/sync.jsonl" \
    > "$OUT/train-sync.log" 2>&1; echo "exit $?"
  grep -E "held training|saved iteration|error" "$OUT/train-sync.log" | tail -3
  SYNC_HELD=$(grep -o "held training [0-9.]*" "$OUT/train-sync.log" | tail -1 | awk '{print $3}')
  SYNC_RATE=$(grep -o "s: [0-9.]* GB/s" "$OUT/train-sync.log" | tail -1 | awk '{print $2}')
  rm -rf "$S/sync"

fi
if [[ ,$PARTS, == *,2b,* ]]; then
  echo "== 2b. dlm-train 1.7B --async-save, saves after iterations 30 and 60 (the run's end waits for the last)"
  rm -rf "$S/async"
  timeout 300 "$C/dlm-train" "${MODEL[@]}" --train-iters 60 --save "$S/async" --save-interval 30 --async-save \
    --metrics-file "$OUT/async.jsonl" > "$OUT/train-async.log" 2>&1; echo "exit $?"
  grep -E "held training|saved iteration|error" "$OUT/train-async.log" | tail -5
  ASYNC_HELD=$(grep -o "iteration 30: the checkpoint held training [0-9.]*" "$OUT/train-async.log" | awk '{print $NF}')
  # The second save reuses the host buffers the first one allocated (the pinned device->host buffers, the snapshot);
  # 30 steps (about 20 s) after the first, whose write (about 16 s) is then done and does not hold it.
  ASYNC_HELD2=$(grep -o "iteration 60: the checkpoint held training [0-9.]*" "$OUT/train-async.log" | awk '{print $NF}')
  ASYNC_RATE=$(grep "saved iteration 30 " "$OUT/train-async.log" | grep -o "s: [0-9.]* GB/s" | awk '{print $2}')
  ASYNC_WRITE=$(grep "saved iteration 30 " "$OUT/train-async.log" | grep -o "GB in [0-9.]* s" | awk '{print $3}')
  # Steps before any save (4..30: past the first steps' warm-up) against the steps the background write overlaps
  # (31..36: the write of 20.8 GB takes longer than six steps at any rate this disk reaches).
  BEFORE=$(step_seconds "$OUT/async.jsonl" 4 30)
  DURING=$(step_seconds "$OUT/async.jsonl" 31 36)
  # The save window: iterations 30 .. 30+WINDOW-1 with the pause after iteration 30, per step, against the mean step
  # of 4..29 (no save point among them).
  PLAIN_MEAN=$(step_seconds "$OUT/async.jsonl" 4 29 mean)
  WINDOW_MEAN=$(step_seconds "$OUT/async.jsonl" 30 $((29 + WINDOW)) mean "$ASYNC_HELD")
  echo "save-point pause (iteration 30): ${ASYNC_HELD} s; iteration 60: ${ASYNC_HELD2} s"
  echo "mean step over the save window (iterations 30-$((29 + WINDOW)), pause included): ${WINDOW_MEAN} s;" \
       "without saving (4-29): ${PLAIN_MEAN} s"
  rm -rf "$S/async"

fi
if [[ ,$PARTS, == *,3,* ]]; then
  echo "== 3. --async-save, SIGKILL while iteration 8's checkpoint is written in the background"
  rm -rf "$S/kill" && rm -f "$OUT/kill.log"
  "$C/dlm-train" "${MODEL[@]}" --train-iters 30 --save "$S/kill" --save-interval 4 --async-save \
    > "$OUT/train-kill.log" 2>&1 &
  PID=$!
  KILLED=no
  for i in $(seq 1 1200); do  # at most 240 s
    if [ -d "$S/kill/iter_0000008.tmp" ] && [ -f "$S/kill/latest" ] && grep -q "iteration 8: the checkpoint held training" "$OUT/train-kill.log"; then
      kill -9 $PID; KILLED=yes; break
    fi
    sleep 0.2
  done
  [ $KILLED = yes ] || kill -9 $PID 2>/dev/null
  wait $PID 2>/dev/null
  sleep 1
  LATEST=$(cat "$S/kill/latest" 2>/dev/null | tr -d '\n')
  TMP_LEFT=$([ -d "$S/kill/iter_0000008.tmp" ] && echo yes || echo no)
  echo "killed: $KILLED; latest: $LATEST; iter_0000008.tmp still there (the kill hit the write): $TMP_LEFT"
  timeout 200 "$C/dlm-train" "${MODEL[@]}" --train-iters 5 --load "$S/kill" > "$OUT/train-resume.log" 2>&1
  RESUME_EXIT=$?
  grep -E "resuming|error" "$OUT/train-resume.log" | tail -2
  RESUMED=$(grep -q "iter_0000004 at iteration 4" "$OUT/train-resume.log" && [ $RESUME_EXIT = 0 ] && echo yes || echo no)
  rm -rf "$S/kill"

fi
python3 - "$DD" "$HOST" "$SYNC_HELD" "$SYNC_RATE" "$ASYNC_HELD" "$ASYNC_HELD2" "$ASYNC_RATE" "$ASYNC_WRITE" "$BEFORE" "$DURING" \
  "$PLAIN_MEAN" "$WINDOW_MEAN" "$KILLED" "$LATEST" "$TMP_LEFT" "$RESUMED" "$WINDOW" <<'EOF' | tee "$OUT/summary.txt"
import sys
a = sys.argv[1:]
f = lambda x: float(x) if x not in ("", "nan") else float("nan")
dd, host, sync_held, sync_rate, async_held, async_held2, async_rate, async_write, before, during, plain, window = map(f, a[:12])
killed, latest, tmp_left, resumed, n = a[12:]
rows = [
    ("disk: dd bs=64M oflag=direct conv=fsync", f"{dd:.2f} GB/s", ""),
    ("blocking save from host memory (save_bench, 20.8 GB)", f"{host:.2f} GB/s", f"{host / dd:.2f}x dd (goal >= 0.8)"),
    ("dlm-train blocking save: training held", f"{sync_held:.1f} s", f"written at {sync_rate:.2f} GB/s = {sync_rate / dd:.2f}x dd"),
    ("dlm-train --async-save: training held at the save point", f"{async_held:.2f} s", "first save (buffers pinned at start-up)"),
    ("--async-save: held at the second save point (iteration 60)", f"{async_held2:.2f} s", "copies enqueued only"),
    ("--async-save background write + commit", f"{async_write:.1f} s", f"{async_rate:.2f} GB/s = {async_rate / dd:.2f}x dd"),
    ("step time before any save (iterations 4-30, median)", f"{before:.3f} s", ""),
    ("step time during the background write (31-36, median)", f"{during:.3f} s",
     f"{during / before - 1:+.1%}: {'within' if during <= 1.1 * before else 'NOT within'} 10%"),
    ("step time without saving (iterations 4-29, mean)", f"{plain:.4f} s", ""),
    (f"save window of {n} steps (30-{29 + int(n)}, pause included, mean)", f"{window:.4f} s",
     f"ratio {window / plain:.3f}: {'within' if window <= 1.1 * plain else 'NOT within'} 10%"),
    ("SIGKILL during the background write of iteration 8", f"killed {killed}, write hit {tmp_left}",
     f"latest {latest} ({'ok' if latest == 'iter_0000004' else 'WRONG'}), resumed from it: {resumed}"),
]
w = max(len(r[0]) for r in rows)
for r in rows:
    print(f"{r[0]:<{w}}  {r[1]:>22}  {r[2]}")
EOF
