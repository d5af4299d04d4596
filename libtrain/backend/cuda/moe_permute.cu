// The token permutation around the experts' grouped GEMMs (moe_kernels.h). Sorting the N * k slots by expert, with
// slot order kept inside an expert, is a counting sort in three passes, each deterministic:
//   count:  a warp per chunk of kSortChunk slots counts each expert's slots in the chunk  -> counts [chunks, E]
//   scan:   offsets[e] = sum of the totals of the experts before e; counts[c][e] becomes the row where chunk c's
//           first slot of expert e goes (offsets[e] + that expert's slots in the chunks before c)
//   assign: each chunk's warp walks its slots 32 at a time; lanes of the same expert (__match_any_sync) take rows
//           in lane order after the chunk's running count for that expert.
#include <algorithm>

#include "common.cuh"
#include "moe_kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kSortChunk = 256;

std::int64_t sort_chunks(std::int64_t slots) { return (slots + kSortChunk - 1) / kSortChunk; }

__global__ void expert_count(const int* idx, int slots, int experts, int* counts) {
  extern __shared__ int cnt[];
  const int lane = threadIdx.x;
  for (int e = lane; e < experts; e += 32) cnt[e] = 0;
  __syncwarp();
  const int first = blockIdx.x * kSortChunk, end = min(first + kSortChunk, slots);
  for (int r = first + lane; r < end; r += 32) atomicAdd(&cnt[idx[r]], 1);
  __syncwarp();
  for (int e = lane; e < experts; e += 32) counts[static_cast<std::int64_t>(blockIdx.x) * experts + e] = cnt[e];
}

__global__ void expert_scan(int* counts, int chunks, int experts, int* offsets) {
  extern __shared__ int total[];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int t = 0;
    for (int c = 0; c < chunks; ++c) t += counts[static_cast<std::int64_t>(c) * experts + e];
    total[e] = t;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = run;
      run += total[e];
      total[e] = offsets[e];
    }
    offsets[experts] = run;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int run = total[e];
    for (int c = 0; c < chunks; ++c) {
      int& cell = counts[static_cast<std::int64_t>(c) * experts + e];
      const int t = cell;
      cell = run;
      run += t;
    }
  }
}

__global__ void expert_assign(const int* idx, int slots, int experts, const int* bases, int* where, int* order) {
  extern __shared__ int running[];
  const int lane = threadIdx.x;
  for (int e = lane; e < experts; e += 32) running[e] = bases[static_cast<std::int64_t>(blockIdx.x) * experts + e];
  __syncwarp();
  const int first = blockIdx.x * kSortChunk, end = min(first + kSortChunk, slots);
  const unsigned below = (1u << lane) - 1u;
  for (int r0 = first; r0 < end; r0 += 32) {
    const int r = r0 + lane;
    const bool here = r < end;
    const int e = here ? idx[r] : -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    int row = 0;
    if (here) {
      row = running[e] + __popc(same & below);
      where[r] = row;
      order[row] = r;
    }
    __syncwarp();
    if (here && (same >> lane) == 1u) running[e] += __popc(same);  // the group's highest lane
    __syncwarp();
  }
}

// A thread per sorted row: its rank among its expert's rows (by position: its place; by probs: the rows of a larger w,
// or of the same w and an earlier slot, which sorts before it in slot order).
__global__ void capacity_rank_k(const int* idx, const int* order, const int* offsets, int rows, int capacity,
                                bool by_position, const float* w, std::uint8_t* kept) {
  const int r = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int slot = order[r], e = idx[slot], begin = offsets[e], end = offsets[e + 1];
  int rank = r - begin;
  if (end - begin > capacity && !by_position) {
    const float mine = w[slot];
    rank = 0;
    for (int q = begin; q < end; ++q) {
      const float other = w[order[q]];
      rank += other > mine || (other == mine && q < r);
    }
  }
  kept[slot] = rank < capacity;
}

__global__ void zero_dropped_k(const std::uint8_t* kept, int slots, float* w) {
  const int i = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < slots && !kept[i]) w[i] = 0.0f;
}

// Row copies: a warp per row (gather) or token (expand), its row indices read once and broadcast; each lane loads
// its kRowVecs 16-byte vectors of a stretch before storing any, so a warp keeps a whole 4 KB row in flight (the
// copies are latency-bound otherwise). The expand reads each token's row once and stores it to its k rows.
constexpr int kRowVecs = 8;
constexpr int kRowWarps = 8;  // warps (rows) per block

// One stretch of a row: lane's vectors c0 + u * 32 + lane, u < kRowVecs.
__device__ __forceinline__ void load_stretch(const Bf16x8* in, int c0, int vecs, int lane, Bf16x8 (&v)[kRowVecs]) {
#pragma unroll
  for (int u = 0; u < kRowVecs; ++u)
    if (const int c = c0 + u * 32 + lane; c < vecs) v[u] = in[c];
}
__device__ __forceinline__ void store_stretch(Bf16x8* out, int c0, int vecs, int lane, const Bf16x8 (&v)[kRowVecs]) {
#pragma unroll
  for (int u = 0; u < kRowVecs; ++u)
    if (const int c = c0 + u * 32 + lane; c < vecs) out[c] = v[u];
}

__global__ void gather_k(const bf16* src, const int* order, int rows, int k, int d, bf16* dst) {
  const int lane = threadIdx.x & 31, vecs = d / 8;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const std::int64_t token = __shfl_sync(0xffffffffu, lane == 0 ? order[row] : 0, 0) / k;
  const auto* in = reinterpret_cast<const Bf16x8*>(src + token * d);
  auto* out = reinterpret_cast<Bf16x8*>(dst + row * d);
  for (int c0 = 0; c0 < vecs; c0 += 32 * kRowVecs) {
    Bf16x8 v[kRowVecs];
    load_stretch(in, c0, vecs, lane, v);
    store_stretch(out, c0, vecs, lane, v);
  }
}

// k <= 32: lane j holds the token's j-th row.
__global__ void expand_k(const bf16* src, const int* where, int tokens, int k, int d, bf16* dst) {
  const int lane = threadIdx.x & 31, vecs = d / 8;
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (n >= tokens) return;
  const int mine = lane < k ? where[n * k + lane] : 0;
  const auto* in = reinterpret_cast<const Bf16x8*>(src + n * d);
  for (int c0 = 0; c0 < vecs; c0 += 32 * kRowVecs) {
    Bf16x8 v[kRowVecs];
    load_stretch(in, c0, vecs, lane, v);
    for (int j = 0; j < k; ++j) {
      const std::int64_t row = __shfl_sync(0xffffffffu, mine, j);
      store_stretch(reinterpret_cast<Bf16x8*>(dst + row * d), c0, vecs, lane, v);
    }
  }
}

__global__ void combine_k(const bf16* rows, const int* where, int k, int d, const bf16* add, bf16* out) {
  const std::int64_t n = blockIdx.x;
  for (int c = threadIdx.x; c < d / 8; c += blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, v[8];
    if (add) unpack8(reinterpret_cast<const Bf16x8*>(add + n * d)[c], acc);
    for (int j = 0; j < k; ++j) {
      unpack8(reinterpret_cast<const Bf16x8*>(rows + static_cast<std::int64_t>(where[n * k + j]) * d)[c], v);
      for (int t = 0; t < 8; ++t) acc[t] += v[t];
    }
    reinterpret_cast<Bf16x8*>(out + n * d)[c] = pack8(acc);
  }
}

__global__ void swiglu_fwd_k(const bf16* gu, const float* w, const int* order, std::int64_t vecs, int ffn, bf16* act) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= vecs) return;
  const int per_row = ffn / 8;
  const std::int64_t row = i / per_row, col = (i % per_row) * 8;
  const float c = w[order[row]];
  float g[8], u[8];
  unpack8(*reinterpret_cast<const Bf16x8*>(gu + row * 2 * ffn + col), g);
  unpack8(*reinterpret_cast<const Bf16x8*>(gu + row * 2 * ffn + ffn + col), u);
  for (int t = 0; t < 8; ++t) g[t] = c * (g[t] / (1.0f + __expf(-g[t])) * u[t]);
  *reinterpret_cast<Bf16x8*>(act + row * ffn + col) = pack8(g);
}

// A block per row.
__global__ void swiglu_bwd_k(const bf16* dact, const bf16* gu, const float* w, const int* order, int ffn, bf16* dgu,
                             float* dw) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const float c = w[order[row]];
  const bf16 *g_row = gu + row * 2 * ffn, *d_row = dact + row * ffn;
  bf16* out = dgu + row * 2 * ffn;
  float dot = 0;
  for (int col = threadIdx.x * 8; col < ffn; col += blockDim.x * 8) {
    float g[8], u[8], d[8], dg[8], du[8];
    unpack8(*reinterpret_cast<const Bf16x8*>(g_row + col), g);
    unpack8(*reinterpret_cast<const Bf16x8*>(g_row + ffn + col), u);
    unpack8(*reinterpret_cast<const Bf16x8*>(d_row + col), d);
    for (int t = 0; t < 8; ++t) {
      const float sg = 1.0f / (1.0f + __expf(-g[t])), silu = g[t] * sg, da = c * d[t];
      dot += d[t] * silu * u[t];
      dg[t] = da * u[t] * sg * (1.0f + g[t] * (1.0f - sg));
      du[t] = da * silu;
    }
    *reinterpret_cast<Bf16x8*>(out + col) = pack8(dg);
    *reinterpret_cast<Bf16x8*>(out + ffn + col) = pack8(du);
  }
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0) dw[order[row]] = dot;
}

// A grid row per expert: an expert with rows leaves at once, an empty one's blocks zero its slice.
__global__ void clear_empty_k(float* grad, const int* offsets, std::int64_t per_expert) {
  const int e = blockIdx.y;
  if (offsets[e + 1] != offsets[e]) return;
  auto* g = reinterpret_cast<float4*>(grad + e * per_expert);
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < per_expert / 4;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    g[i] = make_float4(0, 0, 0, 0);
}

unsigned blocks(std::int64_t n, int per) { return static_cast<unsigned>((n + per - 1) / per); }
// Threads of a block per row: the row's 16-byte vectors, rounded up to a warp, at most 256.
unsigned row_threads(int width) {
  return static_cast<unsigned>(std::min(256, std::max(32, (width / 8 + 31) / 32 * 32)));
}

}  // namespace

std::int64_t moe_sort_scratch_ints(std::int64_t slots, int experts) { return sort_chunks(slots) * experts; }

void moe_sort_by_expert(const int* idx, int slots, int experts, int* chunk_counts, int* offsets, int* where,
                        int* order, cudaStream_t stream) {
  const auto chunks = static_cast<unsigned>(sort_chunks(slots));
  const std::size_t shared = sizeof(int) * static_cast<std::size_t>(experts);
  if (chunks > 0) expert_count<<<chunks, 32, shared, stream>>>(idx, slots, experts, chunk_counts);
  expert_scan<<<1, 256, shared, stream>>>(chunk_counts, static_cast<int>(chunks), experts, offsets);
  if (chunks > 0) expert_assign<<<chunks, 32, shared, stream>>>(idx, slots, experts, chunk_counts, where, order);
}

void moe_drop_over_capacity(const int* idx, const int* order, const int* offsets, int rows, int capacity,
                            bool by_position, float* w, std::uint8_t* kept, cudaStream_t stream) {
  if (rows <= 0) return;
  capacity_rank_k<<<blocks(rows, 256), 256, 0, stream>>>(idx, order, offsets, rows, capacity, by_position, w, kept);
  zero_dropped_k<<<blocks(rows, 256), 256, 0, stream>>>(kept, rows, w);
}

void moe_gather(const bf16* src, const int* order, int rows, int k, int d, bf16* dst, cudaStream_t stream) {
  if (rows > 0) gather_k<<<blocks(rows, kRowWarps), kRowWarps * 32, 0, stream>>>(src, order, rows, k, d, dst);
}

void moe_expand(const bf16* src, const int* where, int tokens, int k, int d, bf16* dst, cudaStream_t stream) {
  if (tokens > 0) expand_k<<<blocks(tokens, kRowWarps), kRowWarps * 32, 0, stream>>>(src, where, tokens, k, d, dst);
}

void moe_combine(const bf16* rows, const int* where, int tokens, int k, int d, const bf16* add, bf16* out,
                 cudaStream_t stream) {
  if (tokens > 0) combine_k<<<static_cast<unsigned>(tokens), row_threads(d), 0, stream>>>(rows, where, k, d, add, out);
}

void moe_swiglu_forward(const bf16* gu, const float* w, const int* order, int rows, int ffn, bf16* act,
                        cudaStream_t stream) {
  const std::int64_t vecs = static_cast<std::int64_t>(rows) * (ffn / 8);
  if (vecs > 0) swiglu_fwd_k<<<blocks(vecs, 256), 256, 0, stream>>>(gu, w, order, vecs, ffn, act);
}

void moe_swiglu_backward(const bf16* dact, const bf16* gu, const float* w, const int* order, int rows, int ffn,
                         bf16* dgu, float* dw, cudaStream_t stream) {
  if (rows > 0)
    swiglu_bwd_k<<<static_cast<unsigned>(rows), row_threads(ffn), 0, stream>>>(dact, gu, w, order, ffn, dgu, dw);
}

void moe_clear_empty_experts(float* grad, const int* offsets, int experts, std::int64_t per_expert,
                             cudaStream_t stream) {
  if (experts <= 0 || per_expert <= 0) return;
  const dim3 grid(std::min(blocks(per_expert / 4, 256), 64u), static_cast<unsigned>(experts));
  clear_empty_k<<<grid, 256, 0, stream>>>(grad, offsets, per_expert);
}

}  // namespace dlm::train::cuda
