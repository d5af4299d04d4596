// Element-wise conversions, fills and adds, and the loss's sum.
#include <cmath>

#include "kernels.h"
#include "philox.cuh"

namespace dlm::train::cuda {
namespace {

__global__ void to_bf16(const float* in, bf16* out, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}
__global__ void to_f32(const bf16* in, float* out, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(in[i]);
}
__global__ void add_bf16_kernel(const bf16* a, const bf16* b, bf16* out, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}
// One block: thread t sums elements t, t + 1024, ... in double, then a fixed tree: the same order every run.
__global__ void __launch_bounds__(1024) sum_into(const float* x, std::int64_t n, double* total) {
  __shared__ double part[1024];
  double s = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += 1024) s += x[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = 512; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *total += part[0];
}
__global__ void fill(float* p, float value, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

__device__ std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__global__ void normal(float* p, std::int64_t n, float std, std::uint64_t seed) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const std::uint64_t h = mix(seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i));
  const float u1 = (static_cast<float>(h >> 40) + 1.0f) / 16777217.0f, u2 = static_cast<float>((h >> 8) & 0xFFFFFF) / 16777216.0f;
  p[i] = std * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// Model::init's draw (libtrain/model/model.cpp): pair e/2 of tensor t from (seed, "INIT", t, e/2) by
// Box-Muller in double, so a GPU run starts from the very weights of a CPU run of the same seed.
__global__ void normal_counter(float* p, std::int64_t n, double std, std::uint64_t seed, std::uint32_t tensor) {
  constexpr std::uint32_t kInitDomain = 0x494e4954;  // "INIT"
  const std::int64_t pair = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t e = pair * 2;
  if (e >= n) return;
  const auto sub = static_cast<std::uint32_t>(pair);
  const double u1 = 1.0 - philox_uniform(seed, kInitDomain, tensor, sub);
  const double u2 = philox_uniform(seed, kInitDomain + 1, tensor, sub);
  const double radius = std * sqrt(-2.0 * log(u1));
  p[e] = static_cast<float>(radius * cos(2 * M_PI * u2));
  if (e + 1 < n) p[e + 1] = static_cast<float>(radius * sin(2 * M_PI * u2));
}

}  // namespace

void init_normal_counter(float* p, std::int64_t n, double std, std::uint64_t seed, std::uint32_t tensor,
                         cudaStream_t stream) {
  const std::int64_t pairs = (n + 1) / 2;
  if (n > 0) normal_counter<<<static_cast<unsigned>((pairs + 255) / 256), 256, 0, stream>>>(p, n, std, seed, tensor);
}

void init_normal(float* p, std::int64_t n, float std, std::uint64_t seed, cudaStream_t stream) {
  if (n > 0) normal<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p, n, std, seed);
}

void f32_to_bf16(const float* in, bf16* out, std::int64_t n, cudaStream_t stream) {
  if (n > 0) to_bf16<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(in, out, n);
}
void bf16_to_f32(const bf16* in, float* out, std::int64_t n, cudaStream_t stream) {
  if (n > 0) to_f32<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(in, out, n);
}
void add_bf16(const bf16* a, const bf16* b, bf16* out, std::int64_t n, cudaStream_t stream) {
  if (n > 0) add_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(a, b, out, n);
}
void accumulate_sum(const float* x, std::int64_t n, double* total, cudaStream_t stream) {
  if (n > 0) sum_into<<<1, 1024, 0, stream>>>(x, n, total);
}
void fill_f32(float* p, float value, std::int64_t n, cudaStream_t stream) {
  if (n > 0) fill<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p, value, n);
}

}  // namespace dlm::train::cuda
