// The master weights' halves (master_split.h) from fp32 values and back, element by element.
#include "kernels.h"
#include "master_split.h"

namespace dlm::train::cuda {
namespace {

__global__ void split_kernel(const float* values, bf16* hi, std::int16_t* lo, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const MasterHalves h = split_master_bits(__float_as_uint(values[i]));
  hi[i] = __ushort_as_bfloat16(h.hi);
  if (lo) lo[i] = h.lo;
}

__global__ void join_kernel(const bf16* hi, const std::int16_t* lo, float* out, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __uint_as_float(join_master_bits(__bfloat16_as_ushort(hi[i]), lo[i]));
}

unsigned blocks(std::int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

void split_master(const float* values, bf16* hi, std::int16_t* lo, std::int64_t n, cudaStream_t stream) {
  if (n > 0) split_kernel<<<blocks(n), 256, 0, stream>>>(values, hi, lo, n);
}

void join_master(const bf16* hi, const std::int16_t* lo, float* out, std::int64_t n, cudaStream_t stream) {
  if (n > 0) join_kernel<<<blocks(n), 256, 0, stream>>>(hi, lo, out, n);
}

}  // namespace dlm::train::cuda
