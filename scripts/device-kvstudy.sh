#!/usr/bin/env bash
# The block KV cache's quality and speed on a trained model (issue 34; benchmarks/train/kv_study.py): dlm-train
# trains the 350M shape on .textdata (scripts/dev/make_textdata.py) for at most 4.5 minutes, then every sampler
# (exact, prefix, dual; threshold 0, 0.9, 0.7 and 0.5) continues 64 held-out prompts, scored by the trained model,
# and is timed beside PyTorch on the same weights (PyTorch's rows past --budget-minutes skipped). Sized for one device
# call of under 10 minutes on an H100. Tables in $OUT/kvstudy.md, ready for docs/generation.md.
# usage: scripts/device-kvstudy.sh [CARRIED_DIR=build-cuda/devcarry] [DEVICE=cuda] [extra kv_study.py flags...]
#   On the GPU machine C is device-pack.sh's folder (bundle.tar.xz); for a CPU dry run, a folder holding (links to)
#   dlm-train, dlm-generate and dlm-ckpt and DEVICE=cpu with a small shape, e.g.
#   scripts/device-kvstudy.sh /tmp/kvbin cpu --shape tiny --seq 128 --micro-batch 4 --global-batch 4 \
#     --train-iters 20 --prompt-count 4 --gen 32 --block 16 --timing-batches 1,2
set -uo pipefail
C=${1:-build-cuda/devcarry}
DEVICE=${2:-cuda}
shift $(( $# < 2 ? $# : 2 ))
OUT=${OUT:-/tmp/dlm-out}
if [ -f "$C/bundle.tar.xz" ]; then  # device-pack.sh's archive: unpack beside the tree
  mkdir -p /tmp/devcarry && tar -C /tmp/devcarry -xJf "$C/bundle.tar.xz" && C=/tmp/devcarry
fi
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
PY=${PY:-python3}
[ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python
NV=$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH=$(realpath "$C")/lib:${NV}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
date -u | tee "$OUT/date.txt"
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
fi
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())"
time $PY benchmarks/train/kv_study.py --bin "$C" --device "$DEVICE" --work /tmp/kvstudy --out "$OUT" "$@"
