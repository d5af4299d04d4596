// The MoE router on its fp32 logits l [N, E], a warp per token, lane i holding experts i, i + 32, ...
//   forward:  lse = logsumexp(l); s = exp(l - lse) (softmax) or 1 / (1 + exp(-l)) (sigmoid); top-k by k rounds
//             of a warp argmax (ties: the lower expert); w_j = s_{e_j} / S, S = sum_j s_{e_j} (+ 1e-20 for sigmoid)
//             when norm_topk_prob, else 1.
//   backward (moe_router.h's route_backward, per token):
//     ds[e_j] += norm ? (dw_j - sum_i dw_i w_i) / S : dw_j;  g_e = aux_scale * c_e
//     softmax: ds += g;  dl = s * (ds - sum_e ds s)
//     sigmoid: T = sum_e s + 1e-20;  ds += (g - sum_e g s / T) / T;  dl = ds * s * (1 - s)
//     z-loss:  dl += z_scale * lse * exp(l - lse)
#include <cmath>

#include "common.cuh"
#include "moe_kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kPerLane = kMaxRouterExperts / 32;
constexpr float kSigmoidEps = 1e-20f;  // Megatron's, in the sigmoid router's normalisations

// Loads token n's logits into v (absent experts -inf) and returns their logsumexp.
__device__ __forceinline__ float load_logits(const float* l, int E, int lane, float (&v)[kPerLane]) {
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? l[e] : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  mx = warp_max(mx);
  float sum = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (lane + 32 * i < E) sum += expf(v[i] - mx);
  return mx + logf(warp_sum(sum));
}

__device__ __forceinline__ float score(float l, float lse, bool sigmoid) {
  return sigmoid ? 1.0f / (1.0f + expf(-l)) : expf(l - lse);
}

__global__ void router_fwd(RouterShape r, const float* logits, int* idx, float* w) {
  const int n = static_cast<int>((static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= r.tokens) return;
  float s[kPerLane];
  const float lse = load_logits(logits + static_cast<std::int64_t>(n) * r.experts, r.experts, lane, s);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const float sc = score(s[i], lse, r.sigmoid);
    s[i] = lane + 32 * i >= r.experts ? -1.0f : sc == sc ? sc : -0.5f;
  }
  // Scores are >= 0 (a NaN one reads -0.5, still an expert of the model); an absent expert reads -1 and a chosen
  // one -2, so neither is picked.
  int mine = 0;
  float mine_s = 0, picked = 0;
  for (int j = 0; j < r.topk; ++j) {
    float bv = -3.0f;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (s[i] > bv) bv = s[i], bi = lane + 32 * i;  // i ascending: a tie keeps the lower expert
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == (bi & 31)) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (i == (bi >> 5)) s[i] = -2.0f;
    }
    if (lane == j) mine = bi, mine_s = bv;
    picked += bv;
  }
  const float denom = r.norm_topk_prob ? picked + (r.sigmoid ? kSigmoidEps : 0.0f) : 1.0f;
  if (lane < r.topk) {
    idx[static_cast<std::int64_t>(n) * r.topk + lane] = mine;
    w[static_cast<std::int64_t>(n) * r.topk + lane] = mine_s / denom;
  }
}

__global__ void router_bwd(RouterShape r, const float* logits, const int* idx, const float* w, const float* dw,
                           const int* offsets, const std::uint8_t* kept, int capacity, float aux_scale, float z_scale,
                           bf16* dlogits) {
  const int n = static_cast<int>((static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5);
  const int lane = threadIdx.x & 31, E = r.experts, k = r.topk;
  if (n >= r.tokens) return;
  const float* l = logits + static_cast<std::int64_t>(n) * E;
  float v[kPerLane], s[kPerLane], ds[kPerLane];
  const float lse = load_logits(l, E, lane, v);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const bool here = lane + 32 * i < E;
    s[i] = here ? score(v[i], lse, r.sigmoid) : 0.0f;
    ds[i] = 0;
  }
  const int* ex = idx + static_cast<std::int64_t>(n) * k;
  const float *wn = w + static_cast<std::int64_t>(n) * k, *dwn = dw + static_cast<std::int64_t>(n) * k;
  const std::uint8_t* kn = kept ? kept + static_cast<std::int64_t>(n) * k : nullptr;
  float picked = 0, dot = 0;
  for (int j = 0; j < k; ++j) {
    picked += score(l[ex[j]], lse, r.sigmoid);
    dot += dwn[j] * wn[j];  // a dropped slot's w is 0
  }
  const float denom = r.norm_topk_prob ? picked + (r.sigmoid ? kSigmoidEps : 0.0f) : 1.0f;
  for (int j = 0; j < k; ++j) {
    const int e = ex[j];
    const float dwj = !kn || kn[j] ? dwn[j] : 0.0f;
    const float add = r.norm_topk_prob ? (dwj - dot) / denom : dwj;
    if (lane == (e & 31)) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (i == (e >> 5)) ds[i] += add;
    }
  }
  float g[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    const int count = e < E ? offsets[e + 1] - offsets[e] : 0;
    g[i] = aux_scale * static_cast<float>(capacity > 0 ? min(count, capacity) : count);
  }
  float dl[kPerLane];
  if (r.sigmoid) {
    float total = 0, ga = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) total += s[i];
    total = warp_sum(total) + kSigmoidEps;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) ga += g[i] * s[i];
    ga = warp_sum(ga) / total;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) dl[i] = (ds[i] + (g[i] - ga) / total) * s[i] * (1.0f - s[i]);
  } else {
    float sds = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      ds[i] += g[i];
      sds += ds[i] * s[i];
    }
    sds = warp_sum(sds);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) dl[i] = s[i] * (ds[i] - sds);
  }
  bf16* out = dlogits + static_cast<std::int64_t>(n) * E;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e >= E) continue;
    if (z_scale != 0.0f) dl[i] += z_scale * lse * expf(v[i] - lse);
    out[e] = __float2bfloat16(dl[i]);
  }
}

unsigned warps_grid(int tokens) { return static_cast<unsigned>((static_cast<std::int64_t>(tokens) * 32 + 255) / 256); }

}  // namespace

void moe_router_forward(const RouterShape& r, const float* logits, int* idx, float* w, cudaStream_t stream) {
  if (r.tokens == 0) return;
  router_fwd<<<warps_grid(r.tokens), 256, 0, stream>>>(r, logits, idx, w);
}

void moe_router_backward(const RouterShape& r, const float* logits, const int* idx, const float* w, const float* dw,
                         const int* offsets, const std::uint8_t* kept, int capacity, float aux_scale, float z_scale,
                         bf16* dlogits, cudaStream_t stream) {
  if (r.tokens == 0) return;
  router_bwd<<<warps_grid(r.tokens), 256, 0, stream>>>(r, logits, idx, w, dw, offsets, kept, capacity, aux_scale,
                                                       z_scale, dlogits);
}

}  // namespace dlm::train::cuda
