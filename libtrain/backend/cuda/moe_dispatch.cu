// The expert dispatch's small kernels (moe_dispatch_kernels.h): the per-expert counts from the sort's offsets, and
// the routing weights moved between slot order and row order.
#include "common.cuh"
#include "moe_dispatch_kernels.h"

namespace dlm::train::cuda {
namespace {

__global__ void counts_k(const int* offsets, int experts, int* counts) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e < experts) counts[e] = offsets[e + 1] - offsets[e];
}

__global__ void gather_f32_k(const float* src, const int* index, int n, float* dst) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) dst[i] = src[index[i]];
}

__global__ void scatter_f32_k(const float* src, const int* index, int n, float* dst) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) dst[index[i]] = src[i];
}

constexpr int kThreads = 256;
unsigned blocks_of(int n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

void moe_expert_counts(const int* offsets, int experts, int* counts, cudaStream_t stream) {
  if (experts > 0) counts_k<<<blocks_of(experts), kThreads, 0, stream>>>(offsets, experts, counts);
}

void gather_f32(const float* src, const int* index, int n, float* dst, cudaStream_t stream) {
  if (n > 0) gather_f32_k<<<blocks_of(n), kThreads, 0, stream>>>(src, index, n, dst);
}

void scatter_f32(const float* src, const int* index, int n, float* dst, cudaStream_t stream) {
  if (n > 0) scatter_f32_k<<<blocks_of(n), kThreads, 0, stream>>>(src, index, n, dst);
}

}  // namespace dlm::train::cuda
