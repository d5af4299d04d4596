#!/usr/bin/env bash
# On the machine that builds dlm: builds dp_bench and the NCCL tests in build-nccl and copies them, with the libraries
# a GPU machine without dlm's build dependencies lacks (libfmt, libutf8proc...; MPI, CUDA, cuDNN and NCCL are its
# own), into build-nccl/devcarry, to be copied there.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-nccl}
ninja -C "$B" -j2 dp_bench dlm_nccl_tests
D=$B/devcarry
rm -rf "$D" && mkdir -p "$D/lib"
cp "$B/benchmarks/parallel/dp_bench" "$B/tests/nccl/dlm_nccl_tests" "$D/"
for bin in "$D/dp_bench" "$D/dlm_nccl_tests"; do
  ldd "$bin" | awk '/=>/{print $3}' | grep -E 'libfmt|simdjson|hdf5|boost_program|libsz|libaec|libopenblas|libgfortran|libquadmath|libsentencepiece|libutf8proc|libpcre2|libzstd' | xargs -r -I{} cp -L {} "$D/lib/"
done
du -sh "$D"
