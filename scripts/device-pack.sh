#!/usr/bin/env bash
# On the machine that builds dlm: builds the GPU tests, the benchmarks and the tools (dlm-train / dlm-generate
# --device cuda) in build-cuda and packs them, with the shared libraries a GPU machine without dlm's build
# dependencies lacks, into $B/devcarry/ (ignored with the build folder), to be copied to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-cuda}
# What travels, one binary a line (its path in the build folder); each is built first.
BINARIES=(
  tests/gpu/dlm_gpu_smoke_tests
  tests/gpu/dlm_gpu_tests
  tests/gpu/dlm_gpu_tool_tests
  tests/nccl/dlm_cuda_parallel_tests
  benchmarks/train/cuda_train_bench
  benchmarks/train/cuda_sample_bench
  benchmarks/train/gemm_bench
  benchmarks/train/attention_bench
  benchmarks/train/adamw_bench
  benchmarks/train/norm_bench
  benchmarks/train/fp8_bench
  benchmarks/train/grouped_gemm_bench
  benchmarks/ckpt/save_bench
  benchmarks/parallel/mpi_collective_bench
  tools/dlm-train/dlm-train
  tools/dlm-generate/dlm-generate
  tools/dlm-ckpt/dlm-ckpt
)
ninja -C "$B" -j2 "${BINARIES[@]##*/}"
D=$B/devcarry
rm -rf "$D" && mkdir -p "$D/lib"
for bin in "${BINARIES[@]}"; do cp "$B/$bin" "$D/"; done
strip "$D"/dlm-train "$D"/dlm-generate "$D"/dlm-ckpt "$D"/dlm_gpu_tool_tests 2>/dev/null || true
for bin in "$D/dlm_gpu_tests" "$D/cuda_train_bench" "$D/dlm-train" "$D/dlm-generate" "$D/dlm-ckpt" "$D/dlm_gpu_tool_tests" "$D/save_bench"; do
  ldd "$bin" | awk '/=>/{print $3}' | grep -E 'simdjson|hdf5|boost_program|libsz|libaec|libfmt|libopenblas|libgfortran|libquadmath|libsentencepiece|libutf8proc|libpcre2|libzstd|libdlm|libgloo|libhiredis|libibverbs|libnl-' | xargs -r -I{} cp -L {} "$D/lib/"
done
# One xz archive keeps the copy small (OpenBLAS alone is 36 MB); device-gpu.sh unpacks it.
tar -C "$D" -cf - . | xz -6 -T2 > "$B/devcarry.tar.xz"
rm -rf "$D" && mkdir -p "$D" && mv "$B/devcarry.tar.xz" "$D/bundle.tar.xz"
du -sh "$D"
