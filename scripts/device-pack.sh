#!/usr/bin/env bash
# On the machine that builds dlm: builds the GPU tests, the benchmarks and the tools (dlm-train / dlm-generate
# --device cuda) in build-cuda and packs them, with the shared libraries a GPU machine without dlm's build
# dependencies lacks, into $B/devcarry/ (ignored with the build folder), to be copied to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-cuda}
ninja -C "$B" -j2 dlm_gpu_smoke_tests dlm_gpu_tests dlm_gpu_tool_tests dlm_cuda_parallel_tests cuda_train_bench \
  cuda_sample_bench gemm_bench attention_bench adamw_bench norm_bench grouped_gemm_bench dlm-train dlm-generate save_bench
D=$B/devcarry
rm -rf "$D" && mkdir -p "$D/lib"
cp "$B/tests/gpu/dlm_gpu_smoke_tests" "$B/tests/gpu/dlm_gpu_tests" "$B/tests/gpu/dlm_gpu_tool_tests" \
  "$B/tests/nccl/dlm_cuda_parallel_tests" \
  "$B/benchmarks/train/cuda_train_bench" "$B/benchmarks/train/cuda_sample_bench" "$B/benchmarks/train/gemm_bench" "$B/benchmarks/train/attention_bench" "$B/benchmarks/train/adamw_bench" "$B/benchmarks/train/norm_bench" "$B/benchmarks/train/grouped_gemm_bench" \
  "$B/tools/dlm-train/dlm-train" \
  "$B/tools/dlm-generate/dlm-generate" "$B/benchmarks/ckpt/save_bench" "$D/"
strip "$D"/dlm-train "$D"/dlm-generate "$D"/dlm_gpu_tool_tests 2>/dev/null || true
for bin in "$D/dlm_gpu_tests" "$D/cuda_train_bench" "$D/dlm-train" "$D/dlm-generate" "$D/dlm_gpu_tool_tests" "$D/save_bench"; do
  ldd "$bin" | awk '/=>/{print $3}' | grep -E 'simdjson|hdf5|boost_program|libsz|libaec|libfmt|libopenblas|libgfortran|libquadmath|libsentencepiece|libutf8proc|libpcre2|libzstd|libdlm|libgloo|libhiredis|libibverbs|libnl-' | xargs -r -I{} cp -L {} "$D/lib/"
done
# One xz archive keeps the copy small (OpenBLAS alone is 36 MB); device-gpu.sh unpacks it.
tar -C "$D" -cf - . | xz -6 -T2 > "$B/devcarry.tar.xz"
rm -rf "$D" && mkdir -p "$D" && mv "$B/devcarry.tar.xz" "$D/bundle.tar.xz"
du -sh "$D"
