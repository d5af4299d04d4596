// Token embedding: x[t] = table[ids[t]]; an id of -1 (vocabulary-parallel: a row another rank holds) gives a
// zero row and no gradient.
// Backward: dtable[id] += sum of dx[t] over the tokens t holding id, deterministic (no atomics). The
// tokens are grouped by id on the host (embedding_plan: stable, token order within an id) and cut into
// segments of at most kEmbeddingSegment tokens; one block sums one segment's rows in order. An id with
// one segment adds into its row directly; an id with several (the diffusion objective puts the mask
// token at about half of all positions: one block summing those thousands of rows alone would hold up the
// whole backward) writes per-segment partial rows that a second kernel adds up in segment order.
#include <algorithm>
#include <numeric>

#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_fwd(const int* ids, const bf16* table, bf16* x, std::int64_t vecs, int dim) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= vecs) return;
  const int per_row = dim / 8;
  const std::int64_t t = i / per_row, col = (i % per_row) * 8;
  const int id = ids[t];
  if (id < 0) {
    const float zero[8] = {};
    *reinterpret_cast<Bf16x8*>(x + t * dim + col) = pack8(zero);
    return;
  }
  *reinterpret_cast<Bf16x8*>(x + t * dim + col) =
      *reinterpret_cast<const Bf16x8*>(table + static_cast<std::int64_t>(id) * dim + col);
}

__device__ __forceinline__ void add4(float4& a, const float4& b) { a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w; }

__global__ void __launch_bounds__(kThreads) embedding_bwd_segments(const float* dx, const int* order,
                                                                   const EmbeddingSegment* segs, float* partial,
                                                                   float* dtable, std::uint8_t* rows_written,
                                                                   int dim) {
  const EmbeddingSegment s = segs[blockIdx.x];
  if (rows_written && threadIdx.x == 0) rows_written[s.id] = 1;
  const int vecs = dim / 4;
  const auto* in = reinterpret_cast<const float4*>(dx);
  auto* out = reinterpret_cast<float4*>(s.slot < 0 ? dtable + static_cast<std::int64_t>(s.id) * dim
                                                    : partial + static_cast<std::int64_t>(s.slot) * dim);
  for (int c = threadIdx.x; c < vecs; c += kThreads) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int k = s.begin; k < s.end; ++k) add4(acc, in[static_cast<std::int64_t>(order[k]) * vecs + c]);
    if (s.slot < 0) add4(acc, out[c]);
    out[c] = acc;
  }
}

__global__ void __launch_bounds__(kThreads) embedding_bwd_combine(const EmbeddingCombine* comb, const float* partial,
                                                                  float* dtable, int dim) {
  const EmbeddingCombine g = comb[blockIdx.x];
  const int vecs = dim / 4;
  const auto* in = reinterpret_cast<const float4*>(partial);
  auto* out = reinterpret_cast<float4*>(dtable + static_cast<std::int64_t>(g.id) * dim);
  for (int c = threadIdx.x; c < vecs; c += kThreads) {
    float4 acc = out[c];
    for (int k = 0; k < g.count; ++k) add4(acc, in[static_cast<std::int64_t>(g.first_slot + k) * vecs + c]);
    out[c] = acc;
  }
}

// One block per kClearRows rows: a flagged row is zeroed and its flag cleared; the others are not touched.
constexpr int kClearRows = 8;
__global__ void __launch_bounds__(kThreads) clear_rows(float* dtable, std::uint8_t* rows_written, std::int64_t rows,
                                                       int dim) {
  const int vecs = dim / 4;
  for (int k = 0; k < kClearRows; ++k) {
    const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kClearRows + k;
    if (row >= rows || !rows_written[row]) continue;
    auto* out = reinterpret_cast<float4*>(dtable + row * dim);
    for (int c = threadIdx.x; c < vecs; c += kThreads) out[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __syncthreads();  // every thread has read the flags before they are cleared
  if (threadIdx.x < kClearRows) {
    const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kClearRows + threadIdx.x;
    if (row < rows) rows_written[row] = 0;
  }
}

}  // namespace

void embedding_plan(const int* ids, int tokens, std::vector<int>& order, std::vector<EmbeddingSegment>& segments,
                    std::vector<EmbeddingCombine>& combine) {
  order.resize(static_cast<std::size_t>(tokens));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return ids[x] < ids[y]; });
  segments.clear();
  combine.clear();
  int slots = 0;
  for (int k = 0; k < tokens;) {
    int end = k;
    while (end < tokens && ids[order[end]] == ids[order[k]]) ++end;
    const int id = ids[order[k]], count = end - k;
    if (id < 0) {  // rows another tensor-parallel rank holds
      k = end;
      continue;
    }
    if (count <= kEmbeddingSegment) {
      segments.push_back({id, k, end, -1});
    } else {
      const int pieces = (count + kEmbeddingSegment - 1) / kEmbeddingSegment;
      combine.push_back({id, slots, pieces});
      for (int p = 0; p < pieces; ++p)
        segments.push_back({id, k + p * kEmbeddingSegment, std::min(end, k + (p + 1) * kEmbeddingSegment), slots++});
    }
    k = end;
  }
}

void embedding_forward(const int* ids, const bf16* table, bf16* x, int tokens, int dim, cudaStream_t stream) {
  const std::int64_t vecs = std::int64_t{tokens} * (dim / 8);
  embedding_fwd<<<static_cast<unsigned>((vecs + 255) / 256), 256, 0, stream>>>(ids, table, x, vecs, dim);
}

void embedding_backward(const float* dx, const int* order, const EmbeddingSegment* segments, int num_segments,
                        const EmbeddingCombine* combine, int num_combine, float* partial, float* dtable,
                        std::uint8_t* rows_written, int dim, cudaStream_t stream) {
  if (num_segments > 0)
    embedding_bwd_segments<<<num_segments, kThreads, 0, stream>>>(dx, order, segments, partial, dtable, rows_written,
                                                                  dim);
  if (num_combine > 0) embedding_bwd_combine<<<num_combine, kThreads, 0, stream>>>(combine, partial, dtable, dim);
}

void clear_written_rows(float* dtable, std::uint8_t* rows_written, std::int64_t rows, int dim, cudaStream_t stream) {
  if (rows <= 0) return;
  const auto blocks = static_cast<unsigned>((rows + kClearRows - 1) / kClearRows);
  clear_rows<<<blocks, kThreads, 0, stream>>>(dtable, rows_written, rows, dim);
}

}  // namespace dlm::train::cuda
