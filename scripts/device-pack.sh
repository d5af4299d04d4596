#!/usr/bin/env bash
# On the workstation: builds the GPU tests and benchmark in build-cuda and copies them, with the libraries the
# GPU machine lacks (device.md), into $B/devcarry/ (ignored with the build folder) for the device call's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-cuda}
ninja -C "$B" -j2 dlm_gpu_smoke_tests dlm_gpu_tests cuda_train_bench cuda_sample_bench
D=$B/devcarry
rm -rf "$D" && mkdir -p "$D/lib"
cp "$B/tests/gpu/dlm_gpu_smoke_tests" "$B/tests/gpu/dlm_gpu_tests" "$B/benchmarks/train/cuda_train_bench" \
  "$B/benchmarks/train/cuda_sample_bench" "$D/"
for bin in "$D/dlm_gpu_tests" "$D/cuda_train_bench"; do
  ldd "$bin" | awk '/=>/{print $3}' | grep -E 'simdjson|hdf5|boost_program|libsz|libaec|libfmt|libopenblas|libgfortran|libquadmath|libsentencepiece|libutf8proc|libpcre2|libzstd|libdlm' | xargs -r -I{} cp -L {} "$D/lib/"
done
du -sh "$D"
