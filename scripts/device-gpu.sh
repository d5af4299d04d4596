#!/usr/bin/env bash
# On the GPU machine, in the repository root: the GPU tests, the CPU-parity tests and the training benchmark
# beside PyTorch, logs under $OUT. The binaries are built elsewhere and copied here (scripts/device-pack.sh).
# usage: scripts/device-gpu.sh [CARRIED_DIR=build-cuda/devcarry] [CONFIGS=350m,qwen3-1.7b] [WHAT=tests,bench]
# WHAT: any of tests, tools (dlm-train / dlm-generate --device cuda against the CPU), profile, dlmonly (dlm's
# benchmark without PyTorch), bench (beside PyTorch), accum (beside PyTorch, ACCUMULATE=8 micro-batches per
# optimizer step on both sides), sample (beside PyTorch), dlmsample (dlm's alone), kvcache (sampling beside
# PyTorch's exact sampler and its Fast-dLLM block KV cache, prefix and dual, thresholds 0 and 0.9),
# BASELINE=path/to/another/cuda_train_bench: bench times it too, in the same run (compare.py --baseline).
# kvperf (dlm alone, no PyTorch: the block KV cache's tests, then cuda_sample_bench megadlm-1.7b for none/prefix/dual
# at batch 1 and 16 with full_ms/window_ms per call, and the --profile phases of each mode's forwards at batch 1).
# train (dlm-train --device cuda on the 350M and 1.7B shapes over $DLM_GPU_DATA, a Megatron .bin/.idx prefix
# copied to the machine, then dlm-generate --device cuda from the 350M checkpoint).
# moe (the MoE GPU tests, a tiny MoE step, the moe-2.9b phase times and its benchmark beside PyTorch).
set -uo pipefail
C=${1:-build-cuda/devcarry}
CONFIGS=${2:-350m,qwen3-1.7b}
WHAT=${3:-tests,bench}
OUT=${OUT:-/tmp/dlm-out}
if [ -f "$C/bundle.tar.xz" ]; then  # device-pack.sh's archive: unpack beside the tree
  mkdir -p /tmp/devcarry && tar -C /tmp/devcarry -xJf "$C/bundle.tar.xz" && C=/tmp/devcarry
fi
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
PY=python3
[ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python
export LD_LIBRARY_PATH=$(realpath $C)/lib:$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr '\n' ':')/usr/local/cuda/lib64
export PYTHONUNBUFFERED=1
date -u | tee "$OUT/date.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())"
if [[ $WHAT == *tests* ]]; then
  echo "== tests"
  timeout 60 "$C/dlm_gpu_smoke_tests" 2>&1 | tail -3
  timeout 480 "$C/dlm_gpu_tests" 2>&1 > "$OUT/gpu_tests.log"; echo "dlm_gpu_tests exit $?"
  grep -E "^\[  (FAILED|PASSED) |OK \]|FAILED|Failure|Expected|Which is|actual|cosine|error|rel|first" "$OUT/gpu_tests.log" | head -120
  echo "== parity with the default options, cuDNN's deterministic backward and the own attention kernels"
  grep -E "^\[parity\] [a-z-]+ \((Default|Deterministic|OwnAttention)\)" "$OUT/gpu_tests.log"
  echo "== the block KV cache (tests/gpu/cuda_kv_cache_test.cpp): window vs full logits, GPU vs CPU cached tokens"
  grep -E "^\[kv (window|sampler)\]|CudaKvCache" "$OUT/gpu_tests.log"
  echo "== tiny step"
  timeout 60 "$C/cuda_train_bench" tiny 5 2 2>&1 | tail -3
  echo "== TP2, TP2+SP, PP2, DP2, EP2 against the whole model: 2 ranks sharing this GPU, groups staged through MPI"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun -np 2 --oversubscribe --bind-to none \
    -x LD_LIBRARY_PATH "$C/dlm_cuda_parallel_tests" > "$OUT/cuda_parallel_tests.log" 2>&1; echo "exit $?"
  grep -E "gpu layouts\]|FAILED|Failure|Expected|Which is|passed" "$OUT/cuda_parallel_tests.log" | head -40
  echo "== EP2 x DP2, EP2 x PP2 against the whole model: 4 ranks sharing this GPU"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun -np 4 --oversubscribe --bind-to none \
    -x LD_LIBRARY_PATH "$C/dlm_cuda_parallel_tests" --gtest_filter='*Expert*' > "$OUT/cuda_parallel_tests_np4.log" 2>&1
  echo "exit $?"
  grep -E "gpu layouts\]|FAILED|Failure|Expected|Which is|passed" "$OUT/cuda_parallel_tests_np4.log" | head -40
fi
if [[ $WHAT == *tools* ]]; then
  echo "== dlm-train / dlm-generate --device cuda (tests/gpu/gpu_tool_test.cpp)"
  DLM_TRAIN_TOOL=$(realpath $C/dlm-train) DLM_GENERATE_TOOL=$(realpath $C/dlm-generate) DLM_MPIEXEC=$(command -v mpirun) \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 "$C/dlm_gpu_tool_tests" \
    > "$OUT/gpu_tool_tests.log" 2>&1; echo "dlm_gpu_tool_tests exit $?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|gpu tool|Failure|Expected|Which is|iteration|error" "$OUT/gpu_tool_tests.log" | head -60
fi
if [[ $WHAT == *train* ]]; then
  DATA=${DLM_GPU_DATA:-.gpudata/corpus_text_document}
  common=(--data-path "$DATA" --split 100,0,0 --data-cache-path /tmp/dlm-cache
          --seq-length 2048 --max-position-embeddings 2048 --qk-layernorm --bf16 --lr 2e-4 --log-interval 5 --device cuda)
  echo "== dlm-train --device cuda, 350M shape (micro-batch 8, global batch 32)"
  ( time timeout 300 "$C/dlm-train" "${common[@]}" --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \
      --group-query-attention --num-query-groups 8 --ffn-hidden-size 2816 --vocab-size 50304 --mask-token 50303 --micro-batch-size 8 --global-batch-size 32 \
      --train-iters 20 --save /tmp/ckpt-350m ) 2>&1 | tee "$OUT/train-350m.log" | grep -vE "^\s*$" | tail -12
  echo "== dlm-train --device cuda, 1.7B Qwen3 shape (micro-batch 4, global batch 16)"
  ( time timeout 300 "$C/dlm-train" "${common[@]}" --num-layers 28 --hidden-size 2048 --num-attention-heads 16 \
      --group-query-attention --num-query-groups 8 --kv-channels 128 --ffn-hidden-size 6144 \
      --untie-embeddings-and-output-weights --vocab-size 151936 --mask-token 151935 --micro-batch-size 4 --global-batch-size 16 --train-iters 10 ) 2>&1 \
    | tee "$OUT/train-1.7b.log" | grep -vE "^\s*$" | tail -8
  echo "== dlm-generate --device cuda from the 350M checkpoint (256 tokens, 256 steps, block 32)"
  ( time timeout 120 "$C/dlm-generate" --load /tmp/ckpt-350m --tokenizer-type NullTokenizer --tokenizer-model none \
      --vocab-size 50304 --prompt "11 22 33 44" --max-new-tokens 256 --sample-steps 256 --inference-block-size 32 \
      --no-eos-stop --device cuda ) 2>&1 | tee "$OUT/generate.log" | cut -c1-300 | tail -6
fi
if [[ $WHAT == *profile* ]]; then
  for cfg in ${CONFIGS//,/ }; do
    echo "== phase times ($cfg, --profile: events after each phase, so the step is slower than unprofiled)"
    # Eager module loading: a packed head's new row counts would charge lazy kernel loads to the profiled steps.
    CUDA_MODULE_LOADING=EAGER timeout 240 "$C/cuda_train_bench" --profile "$cfg" 3 2 2>&1 | tee -a "$OUT/profile.log"
  done
fi
if [[ $WHAT == *dlmonly* ]]; then
  for cfg in ${CONFIGS//,/ }; do
    echo "== dlm alone ($cfg)"
    timeout 240 "$C/cuda_train_bench" "$cfg" 10 3 2>&1 | tee -a "$OUT/dlmonly.log"
  done
fi
if [[ $WHAT == *bench* ]]; then
  echo "== benchmark"
  $PY benchmarks/train/compare.py --python "$PY" --bench "$C/cuda_train_bench" --configs "$CONFIGS" \
    ${BASELINE:+--baseline "$BASELINE"} 2>&1 | tee "$OUT/bench.log" | grep -vE "^\s*$" | tail -40
fi
if [[ $WHAT == *accum* ]]; then
  echo "== benchmark with gradient accumulation (ACCUMULATE=${ACCUMULATE:-8} micro-batches per optimizer step, both sides)"
  $PY benchmarks/train/compare.py --python "$PY" --bench "$C/cuda_train_bench" --configs "$CONFIGS" --steps 4 \
    --accumulate "${ACCUMULATE:-8}" 2>&1 | tee "$OUT/accum.log" | grep -vE "^\s*$" | tail -40
fi
if [[ $WHAT == *dlmsample* ]]; then
  for batch in 1 16; do
    echo "== dlm sampling alone (megadlm-1.7b, batch $batch)"
    timeout 240 "$C/cuda_sample_bench" megadlm-1.7b $batch 2>&1 | tee -a "$OUT/dlmsample.log" | tail -2
  done
fi
if [[ $WHAT == *sample* && $WHAT != *dlmsample* ]]; then
  echo "== sampling"
  $PY benchmarks/train/compare_sampling.py --python "$PY" --bench "$C/cuda_sample_bench" 2>&1 | tee "$OUT/sample.log" | grep -vE "^\s*$" | tail -30
fi
if [[ $WHAT == *kvcache* ]]; then
  # One chunk per device call (PyTorch compiles for minutes at the 1.7B shape): KV_MODES=none (default; thresholds
  # 0), prefix or dual (thresholds 0 and 0.9); rows in $OUT/kvcache-MODE.json, merged by compare_sampling.py --table.
  KV_MODES=${KV_MODES:-none}
  KV_THRESHOLDS=${KV_THRESHOLDS:-$([ "$KV_MODES" = none ] && echo 0 || echo 0,0.9)}
  echo "== sampling with the block KV cache (dlm's diffusion_generate_cached beside PyTorch's generate_cached)"
  # KV_BATCHES (default 1,16); KV_FP8=1: dlm's rows also with --fp8.
  $PY benchmarks/train/compare_sampling.py --python "$PY" --bench "$C/cuda_sample_bench" --modes "$KV_MODES" \
    --thresholds "$KV_THRESHOLDS" --batches "${KV_BATCHES:-1,16}" ${KV_FP8:+--fp8} \
    --save "$OUT/kvcache-${KV_MODES//,/-}.json" 2>&1 | tee "$OUT/kvcache.log" | grep -vE "^\s*$" | tail -30
fi
if [[ $WHAT == *kvperf* ]]; then
  echo "== the block KV cache's tests and the attention kernels' (attention.cu shares mma.cuh with kv_cache.cu)"
  timeout 300 "$C/dlm_gpu_tests" --gtest_filter='Windows/WindowAttentionTest.*:CudaKvCache.*:Shapes/AttentionTest.*' > "$OUT/kvperf_tests.log" 2>&1
  echo "exit $?"; grep -E "^\[kv |FAILED|Failure|Expected|Which is|PASSED" "$OUT/kvperf_tests.log" | head -60
  for batch in 1 16; do
    for run in "none 0" "prefix 0" "dual 0" "prefix 0.9" "dual 0.9"; do
      set -- $run
      echo "== cuda_sample_bench megadlm-1.7b $batch 64 256 256 32 $1 $2"
      timeout 240 "$C/cuda_sample_bench" megadlm-1.7b $batch 64 256 256 32 $1 $2 2>&1 | tee -a "$OUT/kvperf.log" | tail -1
    done
  done
  for mode in none prefix dual; do
    echo "== phases, batch 1, $mode (--profile: every forward eager with events, slower than unprofiled)"
    CUDA_MODULE_LOADING=EAGER timeout 240 "$C/cuda_sample_bench" --profile megadlm-1.7b 1 64 256 256 32 $mode 0 2>&1 \
      | tee -a "$OUT/kvperf_profile.log" | grep -vE "^\s*$" | head -120
  done
fi
if [[ $WHAT == *moe* ]]; then
  echo "== MoE: tests/gpu/cuda_moe_test.cpp (router, sort, grouped GEMMs, MoE models against the CPU backend)"
  timeout 300 "$C/dlm_gpu_tests" --gtest_filter='CudaMoe*' > "$OUT/moe_tests.log" 2>&1; echo "MoE tests exit $?"
  grep -E "^\[  (FAILED|PASSED) |OK \]|FAILED|Failure|Expected|Which is|moe parity|error" "$OUT/moe_tests.log" | head -60
  echo "== the experts' grouped GEMMs (CUTLASS, cuBLAS's grouped GEMM) beside one dense GEMM of the same size (moe-2.9b's micro-batch)"
  timeout 120 "$C/grouped_gemm_bench" 2>&1 | tee "$OUT/moe_grouped_gemm.log"
  echo "== tiny MoE step"
  timeout 60 "$C/cuda_train_bench" moe-tiny 5 2 2>&1 | tail -3
  echo "== moe-2.9b phase times (--profile)"
  CUDA_MODULE_LOADING=EAGER timeout 240 "$C/cuda_train_bench" --profile moe-2.9b 3 2 2>&1 | tee "$OUT/moe_profile.log" | tail -30
  echo "== moe-2.9b beside PyTorch (torch._grouped_mm, torch.compile, bf16 autocast)"
  $PY benchmarks/train/compare.py --python "$PY" --bench "$C/cuda_train_bench" --configs moe-2.9b 2>&1 \
    | tee "$OUT/moe_bench.log" | grep -vE "^\s*$" | tail -20
fi
