// QK-norm (RMSNorm over each head's q and k, weights qn / kn shared by the heads) then RoPE, in one pass
// over the fused QKV activation; v is copied through so that attention reads one buffer (unless the attention
// reads V from the projection itself: QkvShape::copy_v). The output (and
// the backward's dout) is in the attention layout [q of every head | k of every group | v of every group]
// per token, which cuDNN's SDPA reads with uniform strides; the input (and dqkv) keep the projection's
// grouped layout.
//   y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps)       (skipped when qk_norm is off: y = x)
//   rope, rotate-half form, pair (i, i + d/2), angle pos * base^(-2i/d):
//     out_i = y_i cos - y_{i+d/2} sin,  out_{i+d/2} = y_{i+d/2} cos + y_i sin
// Backward applies the transposed rotation, then the RMSNorm backward:
//     dy_i = do_i cos + do_{i+d/2} sin,  dy_{i+d/2} = do_{i+d/2} cos - do_i sin
//     dx = rstd * (g - xh * mean(g * xh)), g = dy * w, xh = x * rstd;  dw += dy * xh
// A head slot (token, q head / k / v) is handled by L = head_dim / 8 lanes, each owning 4 rotation pairs
// (8-byte accesses to both halves), so a warp does 32 / L slots at once and the reductions stay inside
// the L lanes. v takes the same path with w = 1, no rotation and no norm. Each thread keeps dw sums for
// its fixed columns; a block sums its threads' in a fixed order into one partial row, and sum_partial_rows
// sums the rows in a fixed order (deterministic).
#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
// 4 blocks of 256 threads fit a Hopper multiprocessor (64 registers a thread, 16 KB of shared memory at
// head_dim 128); 2 a multiprocessor left the loads too few in flight.
int backward_blocks() { return 4 * multiprocessors(); }
constexpr int kPairs = 4;

struct Slot {
  std::int64_t offset;  // element offset of the head inside a token's row of the fused projection
  std::int64_t out;     // and inside a row of the attention layout [q heads | k groups | v groups]
  int kind;             // 0 q, 1 k, 2 v
  int norm_index;       // rstd column: q heads first, then k of each group
};

__device__ Slot slot_of(const QkvShape& s, int n) {
  const int per = s.heads / s.groups;
  const std::int64_t out = std::int64_t(n) * s.head_dim;
  if (n < s.heads) {
    const int g = n / per;
    return {static_cast<std::int64_t>(g * (per + 2) + n % per) * s.head_dim, out, 0, n};
  }
  if (n < s.heads + s.groups) {
    const int g = n - s.heads;
    return {static_cast<std::int64_t>(g * (per + 2) + per) * s.head_dim, out, 1, n};
  }
  const int g = n - s.heads - s.groups;
  return {static_cast<std::int64_t>(g * (per + 2) + per + 1) * s.head_dim, out, 2, -1};
}

// The slots a token has work in: q, k and (when copied) v.
__host__ __device__ __forceinline__ unsigned work_slots(const QkvShape& s) {
  return static_cast<unsigned>(s.heads + s.groups + (s.copy_v ? s.groups : 0));
}
// Item = token * work_slots + slot. An item past the end reads token 0's first slot and is never written, so
// that its lanes still take part in the shuffles (a slot's L lanes agree on live).
struct Place {
  bool live;
  std::int64_t t, row, orow;  // token, element offsets of the head in the projection and attention layouts
  Slot sl;
};
// 32-bit division: tokens * slots < 2^31 is checked by the launchers (64-bit division is a long
// instruction sequence, in the loop of a memory-bound kernel).
__device__ Place place_of(const QkvShape& s, std::int64_t item) {
  const unsigned slots = static_cast<unsigned>(s.heads + 2 * s.groups), work = work_slots(s);
  const bool live = item < static_cast<std::int64_t>(s.tokens) * work;
  const unsigned i = live ? static_cast<unsigned>(item) : 0u;
  const std::int64_t t = i / work;
  const Slot sl = slot_of(s, static_cast<int>(i % work));
  const std::int64_t base = t * slots * s.head_dim;
  return {live, t, base + sl.offset, base + sl.out, sl};
}

__device__ __forceinline__ void load4(const bf16* p, float* f) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}
__device__ __forceinline__ void store4(bf16* p, const float* f) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(f[0], f[1]), b = __floats2bfloat162_rn(f[2], f[3]);
  uint2 raw;
  raw.x = *reinterpret_cast<const unsigned*>(&a);
  raw.y = *reinterpret_cast<const unsigned*>(&b);
  *reinterpret_cast<uint2*>(p) = raw;
}
__device__ __forceinline__ void load4f(const float* p, float* f) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
}
// Sum over the L lanes of a slot (aligned groups of L lanes).
template <int L>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    qk_fwd(QkvShape s, const bf16* qkv, bf16* out, float* rstd, const float* qn, const float* kn, const int* positions,
           const float* cos_t, const float* sin_t) {
  constexpr int L = D / 8, G = 32 / L, half = D / 2;
  const int lane = threadIdx.x & 31, j = (lane % L) * kPairs;
  const std::int64_t item = (static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32) * G + lane / L;
  const auto [live, t, row, orow, sl] = place_of(s, item);
  float a[kPairs], b[kPairs];
  load4(qkv + row + j, a);
  load4(qkv + row + half + j, b);
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) ss += a[i] * a[i] + b[i] * b[i];
  ss = group_sum<L>(ss);
  if (!live) return;
  if (sl.kind == 2) {
    store4(out + orow + j, a);
    store4(out + orow + half + j, b);
    return;
  }
  const float r = s.qk_norm ? rsqrtf(ss / static_cast<float>(D) + s.eps) : 1.0f;
  if (lane % L == 0) rstd[t * (s.heads + s.groups) + sl.norm_index] = r;
  float wa[kPairs] = {1, 1, 1, 1}, wb[kPairs] = {1, 1, 1, 1}, c[kPairs], sn[kPairs];
  if (s.qk_norm) {
    const float* w = sl.kind == 0 ? qn : kn;
    load4f(w + j, wa);
    load4f(w + half + j, wb);
  }
  const std::int64_t pos = positions[t];
  load4f(cos_t + pos * half + j, c);
  load4f(sin_t + pos * half + j, sn);
  float oa[kPairs], ob[kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const float ya = a[i] * r * wa[i], yb = b[i] * r * wb[i];
    oa[i] = ya * c[i] - yb * sn[i];
    ob[i] = yb * c[i] + ya * sn[i];
  }
  store4(out + orow + j, oa);
  store4(out + orow + half + j, ob);
}

template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, 4)
    qk_bwd(QkvShape s, const bf16* dout, const bf16* qkv, const float* rstd, const float* qn, const float* kn,
           const int* positions, const float* cos_t, const float* sin_t, bf16* dqkv, float* partial) {
  constexpr int L = D / 8, G = 32 / L, half = D / 2;
  __shared__ float red[kWarpsPerBlock * G][2 * D];
  const int lane = threadIdx.x & 31, j = (lane % L) * kPairs;
  const std::int64_t total = static_cast<std::int64_t>(s.tokens) * work_slots(s);
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  // dw sums of this thread's columns: [q | k][j..j+3, half+j..half+j+3]
  float dwq[2 * kPairs] = {}, dwk[2 * kPairs] = {};
  for (std::int64_t wi = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; wi * G < total;
       wi += warps) {
    const auto [live, t, row, orow, sl] = place_of(s, wi * G + lane / L);
    float da[kPairs], db[kPairs];
    load4(dout + orow + j, da);
    load4(dout + orow + half + j, db);
    const bool qk = sl.kind != 2;
    float c[kPairs] = {1, 1, 1, 1}, sn[kPairs] = {}, wa[kPairs] = {1, 1, 1, 1}, wb[kPairs] = {1, 1, 1, 1};
    float xa[kPairs] = {}, xb[kPairs] = {};
    float r = 1.0f;
    if (qk) {
      const std::int64_t pos = positions[t];
      load4f(cos_t + pos * half + j, c);
      load4f(sin_t + pos * half + j, sn);
      if (s.qk_norm) {
        const float* w = sl.kind == 0 ? qn : kn;
        load4f(w + j, wa);
        load4f(w + half + j, wb);
        r = rstd[t * (s.heads + s.groups) + sl.norm_index];
        load4(qkv + row + j, xa);
        load4(qkv + row + half + j, xb);
      }
    }
    float dya[kPairs], dyb[kPairs], dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      dya[i] = da[i] * c[i] + db[i] * sn[i];
      dyb[i] = db[i] * c[i] - da[i] * sn[i];
      xa[i] *= r, xb[i] *= r;  // x hat (zero unless q or k with qk_norm)
      dot += dya[i] * wa[i] * xa[i] + dyb[i] * wb[i] * xb[i];
    }
    dot = group_sum<L>(dot) / static_cast<float>(D);
    if (!live) continue;
    float ga[kPairs], gb[kPairs];
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      ga[i] = r * (dya[i] * wa[i] - xa[i] * dot);
      gb[i] = r * (dyb[i] * wb[i] - xb[i] * dot);
    }
    store4(dqkv + row + j, ga);
    store4(dqkv + row + half + j, gb);
    const float fq = sl.kind == 0 ? 1.0f : 0.0f, fk = sl.kind == 1 ? 1.0f : 0.0f;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      dwq[i] += fq * dya[i] * xa[i], dwq[kPairs + i] += fq * dyb[i] * xb[i];
      dwk[i] += fk * dya[i] * xa[i], dwk[kPairs + i] += fk * dyb[i] * xb[i];
    }
  }
  float* mine = red[(threadIdx.x / 32) * G + lane / L];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    mine[j + i] = dwq[i], mine[half + j + i] = dwq[kPairs + i];
    mine[D + j + i] = dwk[i], mine[D + half + j + i] = dwk[kPairs + i];
  }
  __syncthreads();
  for (int col = threadIdx.x; col < 2 * D; col += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < kWarpsPerBlock * G; ++k) acc += red[k][col];
    partial[static_cast<std::int64_t>(blockIdx.x) * 2 * D + col] = acc;
  }
}

template <int D>
void forward_d(const QkvShape& s, const bf16* qkv, bf16* out, float* rstd, const float* qn, const float* kn,
               const int* positions, const float* cos_table, const float* sin_table, cudaStream_t stream) {
  constexpr int G = 32 / (D / 8);
  const std::int64_t items = static_cast<std::int64_t>(s.tokens) * work_slots(s);
  const std::int64_t warps = (items + G - 1) / G;
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  qk_fwd<D><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(s, qkv, out, rstd, qn, kn, positions, cos_table, sin_table);
}

template <int D>
void backward_d(const QkvShape& s, const bf16* dout, const bf16* qkv, const float* rstd, const float* qn,
                const float* kn, const int* positions, const float* cos_table, const float* sin_table, bf16* dqkv,
                float* partial, cudaStream_t stream) {
  qk_bwd<D><<<backward_blocks(), kWarpsPerBlock * 32, 0, stream>>>(s, dout, qkv, rstd, qn, kn, positions, cos_table,
                                                                  sin_table, dqkv, partial);
}

bool slots_fit(const QkvShape& s) {
  return static_cast<std::int64_t>(s.tokens) * (s.heads + 2 * s.groups) < (std::int64_t{1} << 31);
}

}  // namespace

void qk_norm_rope_forward(const QkvShape& s, const bf16* qkv, bf16* out, float* rstd, const float* qn,
                          const float* kn, const int* positions, const float* cos_table, const float* sin_table,
                          cudaStream_t stream) {
  if (!slots_fit(s)) return check_cuda(cudaErrorInvalidValue, "qk_norm_rope: tokens x head slots must be below 2^31");
  switch (s.head_dim) {
    case 16: return forward_d<16>(s, qkv, out, rstd, qn, kn, positions, cos_table, sin_table, stream);
    case 32: return forward_d<32>(s, qkv, out, rstd, qn, kn, positions, cos_table, sin_table, stream);
    case 64: return forward_d<64>(s, qkv, out, rstd, qn, kn, positions, cos_table, sin_table, stream);
    case 128: return forward_d<128>(s, qkv, out, rstd, qn, kn, positions, cos_table, sin_table, stream);
    default: check_cuda(cudaErrorInvalidValue, "qk_norm_rope: head_dim must be 16, 32, 64 or 128");
  }
}

std::int64_t qk_norm_partial_floats(const QkvShape& s) { return std::int64_t{backward_blocks()} * 2 * s.head_dim; }

void qk_norm_rope_backward(const QkvShape& s, const bf16* dout, const bf16* qkv, const float* rstd, const float* qn,
                           const float* kn, const int* positions, const float* cos_table, const float* sin_table,
                           bf16* dqkv, float* dqn, float* dkn, float* partial, cudaStream_t stream) {
  if (!slots_fit(s)) return check_cuda(cudaErrorInvalidValue, "qk_norm_rope: tokens x head slots must be below 2^31");
  switch (s.head_dim) {
    case 16: backward_d<16>(s, dout, qkv, rstd, qn, kn, positions, cos_table, sin_table, dqkv, partial, stream); break;
    case 32: backward_d<32>(s, dout, qkv, rstd, qn, kn, positions, cos_table, sin_table, dqkv, partial, stream); break;
    case 64: backward_d<64>(s, dout, qkv, rstd, qn, kn, positions, cos_table, sin_table, dqkv, partial, stream); break;
    case 128: backward_d<128>(s, dout, qkv, rstd, qn, kn, positions, cos_table, sin_table, dqkv, partial, stream); break;
    default: check_cuda(cudaErrorInvalidValue, "qk_norm_rope: head_dim must be 16, 32, 64 or 128"); return;
  }
  if (s.qk_norm) sum_partial_rows(partial, backward_blocks(), 2 * s.head_dim, dqn, dkn, s.head_dim, stream);
}

}  // namespace dlm::train::cuda
