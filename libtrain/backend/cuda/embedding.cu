// Token embedding: x[t] = table[ids[t]].
// Backward: dtable[id] += sum of dx[t] over the tokens t holding id. The tokens are grouped by id on the
// host (a CSR list, in token order within each id), one block sums one id's rows in that order: no
// atomics, so the result is the same on every run.
#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

__global__ void embedding_fwd(const int* ids, const bf16* table, bf16* x, std::int64_t vecs, int dim) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= vecs) return;
  const int per_row = dim / 8;
  const std::int64_t t = i / per_row, col = (i % per_row) * 8;
  *reinterpret_cast<Bf16x8*>(x + t * dim + col) =
      *reinterpret_cast<const Bf16x8*>(table + static_cast<std::int64_t>(ids[t]) * dim + col);
}

__global__ void embedding_bwd(const float* dx, const int* uids, const int* starts, const int* order, float* dtable,
                              int dim) {
  const int u = blockIdx.x;
  float* out = dtable + static_cast<std::int64_t>(uids[u]) * dim;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    float acc = 0.0f;
    for (int k = starts[u]; k < starts[u + 1]; ++k) acc += dx[static_cast<std::int64_t>(order[k]) * dim + j];
    out[j] += acc;
  }
}

}  // namespace

void embedding_forward(const int* ids, const bf16* table, bf16* x, int tokens, int dim, cudaStream_t stream) {
  const std::int64_t vecs = std::int64_t{tokens} * (dim / 8);
  embedding_fwd<<<static_cast<unsigned>((vecs + 255) / 256), 256, 0, stream>>>(ids, table, x, vecs, dim);
}

void embedding_backward(const float* dx, const int* uids, const int* starts, const int* order, int unique,
                        float* dtable, int dim, cudaStream_t stream) {
  if (unique > 0) embedding_bwd<<<unique, 256, 0, stream>>>(dx, uids, starts, order, dtable, dim);
}

}  // namespace dlm::train::cuda
