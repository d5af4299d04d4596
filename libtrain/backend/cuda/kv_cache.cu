// The samplers' block KV cache on the device (sampler.h; CudaModel's KvCacheUse): the store of every layer's keys
// and values, and the attention of a window of columns over them.
//   kv_store: K after QK-norm and RoPE (the attention layout's k slots) and V (the QKV projection's grouped layout;
//     V takes no norm and no rotation, so both layouts hold the same values) of every token into
//     [tokens, groups, head_dim], bf16, as they are.
//   window_attention: the queries of columns [first, first + width) of each row b attend to every column c < seq
//     of that row, with K[c] = the window's own (computed in this pass) for c inside the window and the store's
//     otherwise (V alike); bidirectional, no mask (CudaModel runs each padding group without its pad columns), GQA
//     (head h reads group h / (heads / groups)):
//       s_c = q . K[c] / sqrt(d),  o = sum_c e^(s_c - m) V[c] / sum_c e^(s_c - m),  m = max_c s_c,
//     in fp32, the max and the sum carried online over tiles of keys (rescaled by e^(m_old - m_new) as a tile
//     raises the max). One block per (query tile, head, row), a warp per query; each tile of keys and values is
//     staged in shared memory once for the block's queries. Plain CUDA cores, no tensor cores: a window step's
//     attention is small beside its GEMMs.
#include <algorithm>
#include <cfloat>

#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kQueries = kThreads / 32;  // a warp per query
constexpr int kKeys = 64;                // keys per staged tile: two per lane in the score pass

__global__ void __launch_bounds__(kThreads)
    kv_store_kernel(const bf16* qkv_rot, const bf16* qkv_raw, int tokens, int heads, int groups, int head_dim,
                    bf16* k, bf16* v) {
  const int vecs = head_dim / 8, per = heads / groups;
  const std::int64_t n = static_cast<std::int64_t>(tokens) * groups * vecs;
  const std::int64_t row = static_cast<std::int64_t>(heads + 2 * groups) * head_dim;
  for (std::int64_t i = blockIdx.x * std::int64_t{kThreads} + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * kThreads) {
    const std::int64_t t = i / (groups * vecs);
    const int g = static_cast<int>(i / vecs % groups), part = static_cast<int>(i % vecs);
    const Bf16x8* ks = reinterpret_cast<const Bf16x8*>(qkv_rot + t * row + (heads + g) * head_dim) + part;
    const Bf16x8* vs = reinterpret_cast<const Bf16x8*>(qkv_raw + t * row + (g * (per + 2) + per + 1) * head_dim) + part;
    reinterpret_cast<Bf16x8*>(k)[i] = *ks;
    reinterpret_cast<Bf16x8*>(v)[i] = *vs;
  }
}

// D: head_dim; each lane owns dims lane, lane + 32, ... of the output (kDims of them).
template <int D>
__global__ void __launch_bounds__(kThreads)
    window_attention_kernel(WindowAttentionShape s, const bf16* qkv_rot, const bf16* qkv_raw, const bf16* k_store,
                            const bf16* v_store, bf16* out) {
  constexpr int kDims = D < 32 ? 1 : D / 32;
  constexpr int kStride = D + 2;  // K rows padded: (D + 2) / 2 words is odd, so a lane per key hits its own bank
  __shared__ __nv_bfloat162 ks[kKeys * kStride / 2];
  __shared__ __nv_bfloat162 vs[kKeys * D / 2];
  __shared__ float qs[kQueries][D];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.z, h = blockIdx.y, per = s.heads / s.groups, g = h / per;
  const int j = blockIdx.x * kQueries + warp;  // the warp's query: column first + j
  const bool live = j < s.width;
  const std::int64_t row = static_cast<std::int64_t>(s.heads + 2 * s.groups) * D;
  const std::int64_t window_row0 = static_cast<std::int64_t>(b) * s.width;  // the window's rows of sequence b
  const float scale = rsqrtf(static_cast<float>(D));
  if (live)
    for (int d = lane; d < D; d += 32)
      qs[warp][d] = __bfloat162float(qkv_rot[(window_row0 + j) * row + h * D + d]) * scale;
  float m = -FLT_MAX, l = 0.0f, o[kDims];
  for (int i = 0; i < kDims; ++i) o[i] = 0.0f;
  for (int c0 = 0; c0 < s.seq; c0 += kKeys) {
    const int n = min(kKeys, s.seq - c0);
    __syncthreads();  // the previous tile is read (and, first time, qs written)
    for (int e = threadIdx.x; e < n * (D / 2); e += kThreads) {
      const int key = e / (D / 2), pair = e % (D / 2), c = c0 + key;
      const bool own = c >= s.first && c < s.first + s.width;
      const std::int64_t at = window_row0 + c - s.first;
      const bf16* kp = own ? qkv_rot + at * row + (s.heads + g) * D
                           : k_store + ((static_cast<std::int64_t>(b) * s.seq + c) * s.groups + g) * D;
      const bf16* vp = own ? qkv_raw + at * row + (g * (per + 2) + per + 1) * D
                           : v_store + ((static_cast<std::int64_t>(b) * s.seq + c) * s.groups + g) * D;
      ks[key * (kStride / 2) + pair] = reinterpret_cast<const __nv_bfloat162*>(kp)[pair];
      vs[key * (D / 2) + pair] = reinterpret_cast<const __nv_bfloat162*>(vp)[pair];
    }
    __syncthreads();
    if (!live) continue;
    // Scores: lane owns keys lane and lane + 32 of the tile (-inf past its end).
    float sc[2];
    for (int half = 0; half < 2; ++half) {
      const int key = lane + 32 * half;
      float acc = -FLT_MAX;
      if (key < n) {
        acc = 0.0f;
        const __nv_bfloat162* kr = ks + key * (kStride / 2);
        for (int p = 0; p < D / 2; ++p) {
          const float2 kf = __bfloat1622float2(kr[p]);
          acc += qs[warp][2 * p] * kf.x + qs[warp][2 * p + 1] * kf.y;
        }
      }
      sc[half] = acc;
    }
    const float m_new = fmaxf(m, warp_max(fmaxf(sc[0], sc[1])));
    const float correction = __expf(m - m_new);
    const float p0 = lane < n ? __expf(sc[0] - m_new) : 0.0f, p1 = lane + 32 < n ? __expf(sc[1] - m_new) : 0.0f;
    l = l * correction + warp_sum(p0 + p1);
    for (int i = 0; i < kDims; ++i) o[i] *= correction;
    const bf16* vt = reinterpret_cast<const bf16*>(vs);
    for (int key = 0; key < n; ++key) {
      const float p = __shfl_sync(0xffffffffu, key < 32 ? p0 : p1, key & 31);
      for (int i = 0; i < kDims; ++i) {
        const int d = lane + 32 * i;
        if (d < D) o[i] += p * __bfloat162float(vt[key * D + d]);
      }
    }
    m = m_new;
  }
  if (!live) return;
  bf16* dst = out + (window_row0 + j) * static_cast<std::int64_t>(s.heads) * D + h * D;
  for (int i = 0; i < kDims; ++i) {
    const int d = lane + 32 * i;
    if (d < D) dst[d] = __float2bfloat16(o[i] / l);
  }
}

}  // namespace

void kv_store(const bf16* qkv_rot, const bf16* qkv_raw, int tokens, int heads, int groups, int head_dim, bf16* k,
              bf16* v, cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(tokens) * groups * (head_dim / 8);
  if (n <= 0) return;
  const int blocks = static_cast<int>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, 16 * multiprocessors()));
  kv_store_kernel<<<blocks, kThreads, 0, stream>>>(qkv_rot, qkv_raw, tokens, heads, groups, head_dim, k, v);
}

void window_attention(const WindowAttentionShape& s, const bf16* qkv_rot, const bf16* qkv_raw, const bf16* k_store,
                      const bf16* v_store, bf16* out, cudaStream_t stream) {
  if (s.batch <= 0 || s.width <= 0) return;
  const dim3 grid((s.width + kQueries - 1) / kQueries, s.heads, s.batch);
  switch (s.head_dim) {
    case 16: return window_attention_kernel<16><<<grid, kThreads, 0, stream>>>(s, qkv_rot, qkv_raw, k_store, v_store, out);
    case 32: return window_attention_kernel<32><<<grid, kThreads, 0, stream>>>(s, qkv_rot, qkv_raw, k_store, v_store, out);
    case 64: return window_attention_kernel<64><<<grid, kThreads, 0, stream>>>(s, qkv_rot, qkv_raw, k_store, v_store, out);
    case 128:
      return window_attention_kernel<128><<<grid, kThreads, 0, stream>>>(s, qkv_rot, qkv_raw, k_store, v_store, out);
    default: return;  // the model refuses other head sizes (attention.cu's set) before it gets here
  }
}

}  // namespace dlm::train::cuda
