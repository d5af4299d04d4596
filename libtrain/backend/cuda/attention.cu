// Flash attention (Dao's FlashAttention-2 schedule) on bf16 tensor cores (mma.sync m16n8k16, fp32
// accumulation), bidirectional or causal, GQA, reading q/k/v in place from the fused QKV activation.
//   forward, per query row i: S_ij = q_i . k_j / sqrt(d) (masked: -inf), m = max_j S, l = sum_j e^(S - m),
//   o_i = sum_j e^(S_ij - m) v_j / l, lse_i = m + log l; blocks of keys update (m, l, o) online.
//   backward, with P = e^(S - lse) recomputed and D_i = dO_i . o_i:
//   dV_j = sum_i P_ij dO_i,  dP_ij = dO_i . v_j,  dS_ij = P_ij (dP_ij - D_i),
//   dK_j = sum_i dS_ij q_i / sqrt(d),  dQ_i = sum_j dS_ij k_j / sqrt(d).
// Deterministic: one kernel owns dK, dV of a key block (summing the heads of its KV group itself), another
// owns dQ of a query block; no atomics. Exponentials in base 2 with log2(e) folded into the scale.
#include <cfloat>

#include "kernels.h"
#include "mma.cuh"

namespace dlm::train::cuda {
namespace {

constexpr float kLn2 = 0.6931471805599453f;

// rows [row0, row0 + rows) of a [*, ld] tensor, columns [col, col + D), into shared rows of stride D + 8;
// rows past `seq` are zero.
template <int D>
__device__ void load_tile(bf16* dst, const bf16* src, std::int64_t ld, std::int64_t col, int row0, int rows, int seq) {
  constexpr int V = D / 8;
  for (int i = threadIdx.x; i < rows * V; i += blockDim.x) {
    const int r = i / V, cc = (i % V) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row0 + r < seq) v = *reinterpret_cast<const uint4*>(src + static_cast<std::int64_t>(row0 + r) * ld + col + cc);
    *reinterpret_cast<uint4*>(dst + r * (D + 8) + cc) = v;
  }
}

// The attention layout of a token's row: [q of every head | k of every group | v of every group] (the one
// cuDNN reads with uniform strides; qk_norm_rope_forward writes it from the fused projection's layout).
struct Layout {
  std::int64_t ld;  // QKV row stride
  int per;          // heads per group
  int heads, groups;
  __device__ Layout(const AttentionShape& s)
      : ld(std::int64_t(s.heads + 2 * s.groups) * s.head_dim), per(s.heads / s.groups), heads(s.heads), groups(s.groups) {}
  __device__ std::int64_t q(int h, int d) const { return std::int64_t(h) * d; }
  __device__ std::int64_t k(int g, int d) const { return std::int64_t(heads + g) * d; }
  __device__ std::int64_t v(int g, int d) const { return std::int64_t(heads + groups + g) * d; }
};

constexpr int kRows = 64;  // query rows (forward, dQ) or key rows (dK dV) of a block: 16 per warp

template <int D>
__global__ void __launch_bounds__(128) attn_fwd(AttentionShape s, const bf16* qkv, bf16* o, float* lse, float scale2) {
  constexpr int ST = D + 8, BN = 64;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sq = reinterpret_cast<bf16*>(smem);
  bf16* sk = sq + kRows * ST;
  bf16* sv = sk + BN * ST;
  const int h = blockIdx.y, b = blockIdx.z, q0 = blockIdx.x * kRows;
  const Layout L(s);
  const int g = h / L.per;
  const bf16* base = qkv + static_cast<std::int64_t>(b) * s.seq * L.ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, c = lane % 4;
  load_tile<D>(sq, base, L.ld, L.q(h, D), q0, kRows, s.seq);
  __syncthreads();
  std::uint32_t qf[D / 16][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) frag_a(qf[kc], sq, ST, warp * 16, kc * 16, gr, c);
  float acc[D / 8][4] = {};
  float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};
  const int row[2] = {q0 + warp * 16 + gr, q0 + warp * 16 + gr + 8};
  const int kend = s.causal ? min(s.seq, q0 + kRows) : s.seq;
  for (int k0 = 0; k0 < kend; k0 += BN) {
    __syncthreads();
    load_tile<D>(sk, base, L.ld, L.k(g, D), k0, BN, s.seq);
    load_tile<D>(sv, base, L.ld, L.v(g, D), k0, BN, s.seq);
    __syncthreads();
    float sc[BN / 8][4];
    tile_scores<BN, D>(sc, qf, sk, ST, gr, c);
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = k0 + nt * 8 + 2 * c + (i & 1);
        const bool dead = col >= s.seq || (s.causal && col > row[i / 2]);
        sc[nt][i] = dead ? -INFINITY : sc[nt][i] * scale2;
      }
    online_softmax<BN, D>(sc, m, l, acc);
    accumulate_pv<BN, D>(acc, sc, sv, ST, gr, c);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (row[r] >= s.seq) continue;
    const float inv = 1.0f / l[r];
    bf16* out = o + (static_cast<std::int64_t>(b) * s.seq + row[r]) * s.heads * D + static_cast<std::int64_t>(h) * D;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
      *reinterpret_cast<std::uint32_t*>(out + nt * 8 + 2 * c) = pack(acc[nt][2 * r] * inv, acc[nt][2 * r + 1] * inv);
    if (c == 0) lse[(static_cast<std::int64_t>(b) * s.heads + h) * s.seq + row[r]] = (m[r] + log2f(l[r])) * kLn2;
  }
}

// D_i = dO_i . o_i, one warp per (token, head).
__global__ void attn_delta(AttentionShape s, const bf16* o, const bf16* dout, float* delta) {
  const std::int64_t item = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (item >= static_cast<std::int64_t>(s.batch) * s.seq * s.heads) return;
  const std::int64_t token = item / s.heads;
  const int h = static_cast<int>(item % s.heads);
  const std::int64_t off = token * s.heads * s.head_dim + static_cast<std::int64_t>(h) * s.head_dim;
  float acc = 0.0f;
  for (int d = lane; d < s.head_dim; d += 32) acc += __bfloat162float(o[off + d]) * __bfloat162float(dout[off + d]);
  for (int k = 16; k > 0; k >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, k);
  const std::int64_t b = token / s.seq, i = token % s.seq;
  if (lane == 0) delta[(b * s.heads + h) * s.seq + i] = acc;
}

// dK, dV of 64 keys of KV group blockIdx.y, summed over the group's heads and every query block.
template <int D, int BQ>
__global__ void __launch_bounds__(128) attn_dkdv(AttentionShape s, const bf16* qkv, const bf16* dout,
                                                 const float* lse, const float* delta, bf16* dqkv, float scale,
                                                 float scale2) {
  constexpr int ST = D + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sk = reinterpret_cast<bf16*>(smem);
  bf16* sv = sk + kRows * ST;
  bf16* sq = sv + kRows * ST;
  bf16* sdo = sq + BQ * ST;
  float* sl = reinterpret_cast<float*>(sdo + BQ * ST);
  float* sd = sl + BQ;
  const int g = blockIdx.y, b = blockIdx.z, k0 = blockIdx.x * kRows;
  const Layout L(s);
  const std::int64_t ldo = static_cast<std::int64_t>(s.heads) * D;
  const bf16* base = qkv + static_cast<std::int64_t>(b) * s.seq * L.ld;
  const bf16* dbase = dout + static_cast<std::int64_t>(b) * s.seq * ldo;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, c = lane % 4;
  load_tile<D>(sk, base, L.ld, L.k(g, D), k0, kRows, s.seq);
  load_tile<D>(sv, base, L.ld, L.v(g, D), k0, kRows, s.seq);
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  const int key[2] = {k0 + warp * 16 + gr, k0 + warp * 16 + gr + 8};
  for (int hh = 0; hh < L.per; ++hh) {
    const int h = g * L.per + hh;
    const float* lse_h = lse + (static_cast<std::int64_t>(b) * s.heads + h) * s.seq;
    const float* delta_h = delta + (static_cast<std::int64_t>(b) * s.heads + h) * s.seq;
    for (int q0 = s.causal ? (k0 / BQ) * BQ : 0; q0 < s.seq; q0 += BQ) {
      __syncthreads();
      load_tile<D>(sq, base, L.ld, L.q(h, D), q0, BQ, s.seq);
      load_tile<D>(sdo, dbase, ldo, static_cast<std::int64_t>(h) * D, q0, BQ, s.seq);
      for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
        sl[i] = q0 + i < s.seq ? lse_h[q0 + i] * kLog2e : 0.0f;
        sd[i] = q0 + i < s.seq ? delta_h[q0 + i] : 0.0f;
      }
      __syncthreads();
      float p[BQ / 8][4] = {}, dp[BQ / 8][4] = {};
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        std::uint32_t ak[4], av[4];
        frag_a(ak, sk, ST, warp * 16, kc * 16, gr, c);
        frag_a(av, sv, ST, warp * 16, kc * 16, gr, c);
#pragma unroll
        for (int nt = 0; nt < BQ / 8; ++nt) {
          std::uint32_t bq[2], bo[2];
          frag_b_rows(bq, sq, ST, nt * 8, kc * 16, gr, c);
          frag_b_rows(bo, sdo, ST, nt * 8, kc * 16, gr, c);
          mma(p[nt], ak, bq);   // S^T = K Q^T
          mma(dp[nt], av, bo);  // dP^T = V dO^T
        }
      }
#pragma unroll
      for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int qi = nt * 8 + 2 * c + (i & 1), q = q0 + qi, kk = key[i / 2];
          const bool dead = q >= s.seq || kk >= s.seq || (s.causal && q < kk);
          p[nt][i] = dead ? 0.0f : exp2f(p[nt][i] * scale2 - sl[qi]);
          dp[nt][i] = p[nt][i] * (dp[nt][i] - sd[qi]);  // dS^T
        }
#pragma unroll
      for (int kc = 0; kc < BQ / 16; ++kc) {
        std::uint32_t ap[4], as[4];
        acc_to_a(ap, p[2 * kc], p[2 * kc + 1]);
        acc_to_a(as, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
          std::uint32_t bo[2], bq[2];
          frag_b_cols(bo, sdo, ST, kc * 16, nt * 8, gr, c);
          frag_b_cols(bq, sq, ST, kc * 16, nt * 8, gr, c);
          mma(dv[nt], ap, bo);  // dV += P^T dO
          mma(dk[nt], as, bq);  // dK += dS^T Q
        }
      }
    }
  }
  bf16* out = dqkv + static_cast<std::int64_t>(b) * s.seq * L.ld;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= s.seq) continue;
    bf16* ko = out + static_cast<std::int64_t>(key[r]) * L.ld + L.k(g, D);
    bf16* vo = out + static_cast<std::int64_t>(key[r]) * L.ld + L.v(g, D);
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      *reinterpret_cast<std::uint32_t*>(ko + nt * 8 + 2 * c) = pack(dk[nt][2 * r] * scale, dk[nt][2 * r + 1] * scale);
      *reinterpret_cast<std::uint32_t*>(vo + nt * 8 + 2 * c) = pack(dv[nt][2 * r], dv[nt][2 * r + 1]);
    }
  }
}

// dQ of 64 queries of head blockIdx.y.
template <int D>
__global__ void __launch_bounds__(128) attn_dq(AttentionShape s, const bf16* qkv, const bf16* dout, const float* lse,
                                               const float* delta, bf16* dqkv, float scale, float scale2) {
  constexpr int ST = D + 8, BK = 64;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sq = reinterpret_cast<bf16*>(smem);
  bf16* sdo = sq + kRows * ST;
  bf16* sk = sdo + kRows * ST;
  bf16* sv = sk + BK * ST;
  const int h = blockIdx.y, b = blockIdx.z, q0 = blockIdx.x * kRows;
  const Layout L(s);
  const int g = h / L.per;
  const std::int64_t ldo = static_cast<std::int64_t>(s.heads) * D;
  const bf16* base = qkv + static_cast<std::int64_t>(b) * s.seq * L.ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, c = lane % 4;
  load_tile<D>(sq, base, L.ld, L.q(h, D), q0, kRows, s.seq);
  load_tile<D>(sdo, dout + static_cast<std::int64_t>(b) * s.seq * ldo, ldo, static_cast<std::int64_t>(h) * D, q0,
               kRows, s.seq);
  const int row[2] = {q0 + warp * 16 + gr, q0 + warp * 16 + gr + 8};
  float l2[2], dd[2];
  for (int r = 0; r < 2; ++r) {
    const std::int64_t at = (static_cast<std::int64_t>(b) * s.heads + h) * s.seq + row[r];
    l2[r] = row[r] < s.seq ? lse[at] * kLog2e : 0.0f;
    dd[r] = row[r] < s.seq ? delta[at] : 0.0f;
  }
  float dq[D / 8][4] = {};
  const int kend = s.causal ? min(s.seq, q0 + kRows) : s.seq;
  for (int k0 = 0; k0 < kend; k0 += BK) {
    __syncthreads();
    load_tile<D>(sk, base, L.ld, L.k(g, D), k0, BK, s.seq);
    load_tile<D>(sv, base, L.ld, L.v(g, D), k0, BK, s.seq);
    __syncthreads();
    float p[BK / 8][4] = {}, dp[BK / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      std::uint32_t aq[4], ao[4];
      frag_a(aq, sq, ST, warp * 16, kc * 16, gr, c);
      frag_a(ao, sdo, ST, warp * 16, kc * 16, gr, c);
#pragma unroll
      for (int nt = 0; nt < BK / 8; ++nt) {
        std::uint32_t bk[2], bv[2];
        frag_b_rows(bk, sk, ST, nt * 8, kc * 16, gr, c);
        frag_b_rows(bv, sv, ST, nt * 8, kc * 16, gr, c);
        mma(p[nt], aq, bk);   // S = Q K^T
        mma(dp[nt], ao, bv);  // dP = dO V^T
      }
    }
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = k0 + nt * 8 + 2 * c + (i & 1), r = i / 2;
        const bool dead = col >= s.seq || row[r] >= s.seq || (s.causal && col > row[r]);
        const float pv = dead ? 0.0f : exp2f(p[nt][i] * scale2 - l2[r]);
        p[nt][i] = pv * (dp[nt][i] - dd[r]);  // dS
      }
    accumulate_pv<BK, D>(dq, p, sk, ST, gr, c);  // dQ += dS K
  }
  bf16* out = dqkv + static_cast<std::int64_t>(b) * s.seq * L.ld;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= s.seq) continue;
    bf16* qo = out + static_cast<std::int64_t>(row[r]) * L.ld + L.q(h, D);
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
      *reinterpret_cast<std::uint32_t*>(qo + nt * 8 + 2 * c) = pack(dq[nt][2 * r] * scale, dq[nt][2 * r + 1] * scale);
  }
}

template <typename Kernel>
void allow_smem(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
               "attention: shared memory limit");
}

template <int D>
void forward_d(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, cudaStream_t stream) {
  const std::size_t smem = 3 * kRows * (D + 8) * sizeof(bf16);
  allow_smem(attn_fwd<D>, smem);
  const float scale2 = kLog2e / sqrtf(static_cast<float>(D));
  attn_fwd<D><<<dim3((s.seq + kRows - 1) / kRows, s.heads, s.batch), 128, smem, stream>>>(s, qkv, o, lse, scale2);
}

template <int D>
void backward_d(const AttentionShape& s, const bf16* qkv, const bf16* dout, const float* lse, const float* delta,
                bf16* dqkv, cudaStream_t stream) {
  constexpr int BQ = D == 128 ? 32 : 64;
  const float scale = 1.0f / sqrtf(static_cast<float>(D)), scale2 = scale * kLog2e;
  const std::size_t smem_kv = (2 * kRows + 2 * BQ) * (D + 8) * sizeof(bf16) + 2 * BQ * sizeof(float);
  allow_smem(attn_dkdv<D, BQ>, smem_kv);
  attn_dkdv<D, BQ><<<dim3((s.seq + kRows - 1) / kRows, s.groups, s.batch), 128, smem_kv, stream>>>(
      s, qkv, dout, lse, delta, dqkv, scale, scale2);
  const std::size_t smem_q = 4 * kRows * (D + 8) * sizeof(bf16);
  allow_smem(attn_dq<D>, smem_q);
  attn_dq<D><<<dim3((s.seq + kRows - 1) / kRows, s.heads, s.batch), 128, smem_q, stream>>>(
      s, qkv, dout, lse, delta, dqkv, scale, scale2);
}

}  // namespace

void attention_forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, cudaStream_t stream) {
  switch (s.head_dim) {
    case 16: return forward_d<16>(s, qkv, o, lse, stream);
    case 32: return forward_d<32>(s, qkv, o, lse, stream);
    case 64: return forward_d<64>(s, qkv, o, lse, stream);
    case 128: return forward_d<128>(s, qkv, o, lse, stream);
    default: check_cuda(cudaErrorInvalidValue, "attention: head_dim must be 16, 32, 64 or 128");
  }
}

void attention_backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout, const float* lse,
                        float* delta, bf16* dqkv, cudaStream_t stream) {
  const std::int64_t warps = static_cast<std::int64_t>(s.batch) * s.seq * s.heads;
  attn_delta<<<static_cast<unsigned>((warps * 32 + 255) / 256), 256, 0, stream>>>(s, o, dout, delta);
  switch (s.head_dim) {
    case 16: return backward_d<16>(s, qkv, dout, lse, delta, dqkv, stream);
    case 32: return backward_d<32>(s, qkv, dout, lse, delta, dqkv, stream);
    case 64: return backward_d<64>(s, qkv, dout, lse, delta, dqkv, stream);
    case 128: return backward_d<128>(s, qkv, dout, lse, delta, dqkv, stream);
    default: check_cuda(cudaErrorInvalidValue, "attention: head_dim must be 16, 32, 64 or 128");
  }
}

}  // namespace dlm::train::cuda
