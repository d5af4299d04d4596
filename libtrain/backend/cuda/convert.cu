// Element-wise conversions and fills.
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

__global__ void to_bf16(const float* in, bf16* out, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}
__global__ void fill(float* p, float value, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

}  // namespace

void f32_to_bf16(const float* in, bf16* out, std::int64_t n, cudaStream_t stream) {
  if (n > 0) to_bf16<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(in, out, n);
}
void fill_f32(float* p, float value, std::int64_t n, cudaStream_t stream) {
  if (n > 0) fill<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p, value, n);
}

}  // namespace dlm::train::cuda
