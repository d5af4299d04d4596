// QK-norm (RMSNorm over each head's q and k, weights qn / kn shared by the heads) then RoPE, in one pass
// over the fused QKV activation; v is copied through so that attention reads one buffer.
//   y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps)       (skipped when qk_norm is off: y = x)
//   rope, rotate-half form, pair (i, i + d/2), angle pos * base^(-2i/d):
//     out_i = y_i cos - y_{i+d/2} sin,  out_{i+d/2} = y_{i+d/2} cos + y_i sin
// Backward applies the transposed rotation, then the RMSNorm backward:
//     dy_i = do_i cos + do_{i+d/2} sin,  dy_{i+d/2} = do_{i+d/2} cos - do_i sin
//     dx = rstd * (g - xh * mean(g * xh)), g = dy * w, xh = x * rstd;  dw += dy * xh
// One warp per (token, head slot); a warp keeps its own dw sums and writes them to a partial row that a
// second kernel sums in a fixed order (deterministic).
#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kBackwardBlocks = 132 * 2;
constexpr int kMaxPairsPerLane = 2;  // head_dim <= 128

struct Slot {
  std::int64_t offset;  // element offset of the head inside a token's row
  int kind;             // 0 q, 1 k, 2 v
  int norm_index;       // rstd column: q heads first, then k of each group
};

__device__ Slot slot_of(const QkvShape& s, int n) {
  const int per = s.heads / s.groups;
  if (n < s.heads) {
    const int g = n / per;
    return {static_cast<std::int64_t>(g * (per + 2) + n % per) * s.head_dim, 0, n};
  }
  if (n < s.heads + s.groups) {
    const int g = n - s.heads;
    return {static_cast<std::int64_t>(g * (per + 2) + per) * s.head_dim, 1, n};
  }
  const int g = n - s.heads - s.groups;
  return {static_cast<std::int64_t>(g * (per + 2) + per + 1) * s.head_dim, 2, -1};
}

__global__ void qk_fwd(QkvShape s, const bf16* qkv, bf16* out, float* rstd, const float* qn, const float* kn,
                       const int* positions, const float* cos_t, const float* sin_t) {
  const int slots = s.heads + 2 * s.groups;
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= static_cast<std::int64_t>(s.tokens) * slots) return;
  const int lane = threadIdx.x & 31;
  const std::int64_t t = item / slots;
  const Slot sl = slot_of(s, static_cast<int>(item % slots));
  const std::int64_t row = t * slots * s.head_dim + sl.offset;
  const int half = s.head_dim / 2;
  if (sl.kind == 2) {
    for (int i = lane; i < s.head_dim; i += 32) out[row + i] = qkv[row + i];
    return;
  }
  float ss = 0.0f;
  for (int i = lane; i < s.head_dim; i += 32) {
    const float x = __bfloat162float(qkv[row + i]);
    ss += x * x;
  }
  ss = warp_sum(ss);
  const float r = s.qk_norm ? rsqrtf(ss / static_cast<float>(s.head_dim) + s.eps) : 1.0f;
  if (lane == 0) rstd[t * (s.heads + s.groups) + sl.norm_index] = r;
  const float* w = sl.kind == 0 ? qn : kn;
  const std::int64_t pos = positions[t];
  for (int i = lane; i < half; i += 32) {
    float a = __bfloat162float(qkv[row + i]) * r, b = __bfloat162float(qkv[row + i + half]) * r;
    if (s.qk_norm) a *= w[i], b *= w[i + half];
    const float c = cos_t[pos * half + i], sn = sin_t[pos * half + i];
    out[row + i] = __float2bfloat16_rn(a * c - b * sn);
    out[row + i + half] = __float2bfloat16_rn(b * c + a * sn);
  }
}

__global__ void qk_bwd(QkvShape s, const bf16* dout, const bf16* qkv, const float* rstd, const float* qn,
                       const float* kn, const int* positions, const float* cos_t, const float* sin_t, bf16* dqkv,
                       float* partial) {
  const int slots = s.heads + 2 * s.groups;
  const int lane = threadIdx.x & 31, half = s.head_dim / 2;
  const std::int64_t warp = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  float dw[2][2 * kMaxPairsPerLane] = {};  // [q or k][pair p: element lane + 32p, then its partner]
  for (std::int64_t item = warp; item < static_cast<std::int64_t>(s.tokens) * slots; item += warps) {
    const std::int64_t t = item / slots;
    const Slot sl = slot_of(s, static_cast<int>(item % slots));
    const std::int64_t row = t * slots * s.head_dim + sl.offset;
    if (sl.kind == 2) {
      for (int i = lane; i < s.head_dim; i += 32) dqkv[row + i] = dout[row + i];
      continue;
    }
    const float r = rstd[t * (s.heads + s.groups) + sl.norm_index];
    const float* w = sl.kind == 0 ? qn : kn;
    const std::int64_t pos = positions[t];
    float dy[2 * kMaxPairsPerLane] = {}, x[2 * kMaxPairsPerLane] = {};
    float dot = 0.0f;
#pragma unroll
    for (int p = 0; p < kMaxPairsPerLane; ++p) {
      const int i = lane + 32 * p;
      if (i < half) {
        const float da = __bfloat162float(dout[row + i]), db = __bfloat162float(dout[row + i + half]);
        const float c = cos_t[pos * half + i], sn = sin_t[pos * half + i];
        dy[2 * p] = da * c + db * sn;
        dy[2 * p + 1] = db * c - da * sn;
        x[2 * p] = __bfloat162float(qkv[row + i]);
        x[2 * p + 1] = __bfloat162float(qkv[row + i + half]);
        if (s.qk_norm) dot += dy[2 * p] * w[i] * x[2 * p] * r + dy[2 * p + 1] * w[i + half] * x[2 * p + 1] * r;
      }
    }
    dot = warp_sum(dot) / static_cast<float>(s.head_dim);
#pragma unroll
    for (int p = 0; p < kMaxPairsPerLane; ++p) {
      const int i = lane + 32 * p;
      if (i < half) {
        if (s.qk_norm) {
          const float xa = x[2 * p] * r, xb = x[2 * p + 1] * r;
          dqkv[row + i] = __float2bfloat16_rn(r * (dy[2 * p] * w[i] - xa * dot));
          dqkv[row + i + half] = __float2bfloat16_rn(r * (dy[2 * p + 1] * w[i + half] - xb * dot));
          dw[sl.kind][2 * p] += dy[2 * p] * xa;
          dw[sl.kind][2 * p + 1] += dy[2 * p + 1] * xb;
        } else {
          dqkv[row + i] = __float2bfloat16_rn(dy[2 * p]);
          dqkv[row + i + half] = __float2bfloat16_rn(dy[2 * p + 1]);
        }
      }
    }
  }
  float* out = partial + warp * 2 * s.head_dim;
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int p = 0; p < kMaxPairsPerLane; ++p) {
      const int i = lane + 32 * p;
      if (i < half) {
        out[k * s.head_dim + i] = dw[k][2 * p];
        out[k * s.head_dim + i + half] = dw[k][2 * p + 1];
      }
    }
}

__global__ void qk_sum_partials(const float* partial, std::int64_t warps, int head_dim, float* dqn, float* dkn) {
  const int j = threadIdx.x;  // [0, 2 * head_dim)
  if (j >= 2 * head_dim) return;
  float acc = 0.0f;
  for (std::int64_t w = 0; w < warps; ++w) acc += partial[w * 2 * head_dim + j];
  if (j < head_dim) dqn[j] += acc;
  else dkn[j - head_dim] += acc;
}

}  // namespace

void qk_norm_rope_forward(const QkvShape& s, const bf16* qkv, bf16* out, float* rstd, const float* qn,
                          const float* kn, const int* positions, const float* cos_table, const float* sin_table,
                          cudaStream_t stream) {
  const std::int64_t items = static_cast<std::int64_t>(s.tokens) * (s.heads + 2 * s.groups);
  const auto blocks = static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
  qk_fwd<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(s, qkv, out, rstd, qn, kn, positions, cos_table, sin_table);
}

std::int64_t qk_norm_partial_floats(const QkvShape& s) {
  return std::int64_t{kBackwardBlocks} * kWarpsPerBlock * 2 * s.head_dim;
}

void qk_norm_rope_backward(const QkvShape& s, const bf16* dout, const bf16* qkv, const float* rstd, const float* qn,
                           const float* kn, const int* positions, const float* cos_table, const float* sin_table,
                           bf16* dqkv, float* dqn, float* dkn, float* partial, cudaStream_t stream) {
  qk_bwd<<<kBackwardBlocks, kWarpsPerBlock * 32, 0, stream>>>(s, dout, qkv, rstd, qn, kn, positions, cos_table,
                                                               sin_table, dqkv, partial);
  if (s.qk_norm)
    qk_sum_partials<<<1, 2 * s.head_dim, 0, stream>>>(partial, std::int64_t{kBackwardBlocks} * kWarpsPerBlock,
                                                       s.head_dim, dqn, dkn);
}

}  // namespace dlm::train::cuda
