#!/usr/bin/env bash
# FP8 convergence (issue 32): the 350M shape (device-common.sh's FLAGS_350M) trained by dlm-train on real text
# (.textdata, scripts/dev/make_textdata.py: GPT-NeoX ids, <|mask_token|> 50277) for 500 iterations of global batch
# 32 x 2048, once per precision, from the same seed (the same data order and the same diffusion masks: both are
# functions of --seed). Logs in $OUT/converge-<run>.log; then benchmarks/train/plot_convergence.py prints the final
# losses (mean of the last ten logged) and their ratio to bf16's, and draws $OUT/fp8_convergence.png where matplotlib
# is installed (elsewhere: run it on the logs afterwards).
# usage: scripts/device-fp8-converge.sh [CARRIED_DIR=build-cuda/devcarry] [RUN...]
#   RUN: bf16 | hybrid (--fp8-format hybrid --fp8-recipe tensorwise) | e4m3 (tensorwise) | delayed (hybrid, delayed
#   scaling: Megatron's default recipe; EXTRA="--fp8-amax-history-len 1024 --fp8-amax-compute-algo max" for TE's);
#   default: bf16 hybrid. One run is ~3-4 min on an H100/H200; each is capped at CAP_MIN minutes (default 4.4, so
#   two fit one 10-minute device call): a capped run's log ends early and the plot script says so.
#   ITERS (default 500) and LOG_INTERVAL (default 5) change the length and the points of the curve; EXTRA (flags
#   appended to every run, the last of a flag wins) and C = a folder with dlm-train make a CPU dry run of the script:
#   EXTRA="--device cpu --num-layers 2 --hidden-size 64 --num-attention-heads 4 --num-query-groups 2
#   --ffn-hidden-size 176 --seq-length 128 --micro-batch-size 4 --global-batch-size 8" ITERS=10 \
#   scripts/device-fp8-converge.sh build/tools/dlm-train bf16
set -uo pipefail
C=${1:-build-cuda/devcarry}
shift $(( $# < 1 ? $# : 1 ))
RUNS=("$@")
[ ${#RUNS[@]} -eq 0 ] && RUNS=(bf16 hybrid)
OUT=${OUT:-/tmp/dlm-out}
ITERS=${ITERS:-500}
LOG_INTERVAL=${LOG_INTERVAL:-5}
CAP_MIN=${CAP_MIN:-4.4}
DLM_GPU_DATA=${DLM_GPU_DATA:-.textdata/text_text_document}
source scripts/device-common.sh
PY=python3
[ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python
if [ ! -f "$DATA.bin" ]; then
  echo "device-fp8-converge: $DATA.bin is missing: carry .textdata (scripts/dev/make_textdata.py writes it)" >&2
  exit 2
fi
date -u | tee "$OUT/date.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
# A learning-rate schedule for 500 iterations (kv_study.py's on the same text): warm-up 50 (a tenth of a shorter
# run), cosine to lr / 10.
SCHEDULE=(--mask-token 50277 --norm-epsilon 1e-6 --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine
          --lr-warmup-iters $(( ITERS / 10 < 50 ? ITERS / 10 : 50 )) --weight-decay 0.1 --adam-beta2 0.95
          --clip-grad 1.0)
logs=()
for run in "${RUNS[@]}"; do
  case $run in
    bf16) precision=() ;;
    hybrid) precision=(--fp8-format hybrid --fp8-recipe tensorwise) ;;
    e4m3) precision=(--fp8-format e4m3 --fp8-recipe tensorwise) ;;
    delayed) precision=(--fp8-format hybrid --fp8-recipe delayed) ;;
    *) echo "device-fp8-converge: unknown run '$run' (bf16, hybrid, e4m3 or delayed)" >&2; exit 2 ;;
  esac
  log=$OUT/converge-$run.log
  t0=$(date +%s)
  "$C/dlm-train" "${FLAGS_350M[@]}" "${SCHEDULE[@]}" --log-interval "$LOG_INTERVAL" --train-iters "$ITERS" \
    --exit-duration-in-mins "$CAP_MIN" "${precision[@]}" ${EXTRA:-} > "$log" 2>&1
  rc=$?
  echo "$run: dlm-train exit $rc in $(( $(date +%s) - t0 )) s; $(grep -c 'lm loss' "$log") losses logged"
  tail -n 2 "$log"
  logs+=("$log")
done
$PY benchmarks/train/plot_convergence.py --png "$OUT/fp8_convergence.png" "${logs[@]}" | tee "$OUT/converge.txt"
