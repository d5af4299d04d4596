// Row gathers and scatters of bf16 matrices: the output layer runs on the rows that carry loss weight
// only (cuda_model_stage.cpp), packed from the final hidden states and unpacked back into their gradient.
#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kThreads = 256;

// packed[i] = x[rows[i]]: one block a packed row, 16-byte vectors.
__global__ void __launch_bounds__(kThreads) gather_kernel(const Bf16x8* x, const int* rows, int vecs, Bf16x8* packed) {
  const std::int64_t i = blockIdx.x;
  const Bf16x8* src = x + static_cast<std::int64_t>(rows[i]) * vecs;
  Bf16x8* dst = packed + i * vecs;
  for (int v = threadIdx.x; v < vecs; v += kThreads) dst[v] = src[v];
}

// x[r] = packed[slot[r]], zeros where slot[r] < 0: one block a row of x.
__global__ void __launch_bounds__(kThreads) scatter_kernel(const Bf16x8* packed, const int* slot, int vecs, Bf16x8* x) {
  const std::int64_t r = blockIdx.x;
  const int s = slot[r];
  Bf16x8* dst = x + r * vecs;
  if (s < 0) {
    const float z[8] = {};
    const Bf16x8 zero = pack8(z);
    for (int v = threadIdx.x; v < vecs; v += kThreads) dst[v] = zero;
    return;
  }
  const Bf16x8* src = packed + static_cast<std::int64_t>(s) * vecs;
  for (int v = threadIdx.x; v < vecs; v += kThreads) dst[v] = src[v];
}

}  // namespace

void gather_rows(const bf16* x, const int* rows, int count, int dim, bf16* packed, cudaStream_t stream) {
  if (count <= 0) return;
  gather_kernel<<<count, kThreads, 0, stream>>>(reinterpret_cast<const Bf16x8*>(x), rows, dim / 8,
                                                reinterpret_cast<Bf16x8*>(packed));
}

void scatter_rows(const bf16* packed, const int* slot, int rows, int dim, bf16* x, cudaStream_t stream) {
  if (rows <= 0) return;
  scatter_kernel<<<rows, kThreads, 0, stream>>>(reinterpret_cast<const Bf16x8*>(packed), slot, dim / 8,
                                                reinterpret_cast<Bf16x8*>(x));
}

}  // namespace dlm::train::cuda
