// bf16 tensor-core fragments (mma.sync m16n8k16, fp32 accumulation) of the attention kernels (attention.cu,
// kv_cache.cu), whose softmax runs in base 2 with log2(e) folded into the scale.
// Fragment layouts (PTX ISA, mma.m16n8k16): g = lane / 4, c = lane % 4;
//   A 16x16: a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B 16x8:  b0 (k = 2c..2c+1, n = g), b1 (k = 2c+8.., n = g);  C 16x8: c0,c1 (g, 2c..), c2,c3 (g+8, 2c..)
// so an accumulator tile of scores is, converted to bf16, the A fragment of the next product.
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels.h"

namespace dlm::train::cuda {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void mma(float* c, const std::uint32_t* a, const std::uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ std::uint32_t ld32(const bf16* p) { return *reinterpret_cast<const std::uint32_t*>(p); }
__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}
__device__ __forceinline__ std::uint32_t pack(bf16 lo, bf16 hi) {
  __nv_bfloat162 v;
  v.x = lo;
  v.y = hi;
  return *reinterpret_cast<std::uint32_t*>(&v);
}
// A(m, k) = T[row0 + m][k0 + k]
__device__ __forceinline__ void frag_a(std::uint32_t* a, const bf16* t, int st, int row0, int k0, int g, int c) {
  a[0] = ld32(t + (row0 + g) * st + k0 + 2 * c);
  a[1] = ld32(t + (row0 + g + 8) * st + k0 + 2 * c);
  a[2] = ld32(t + (row0 + g) * st + k0 + 8 + 2 * c);
  a[3] = ld32(t + (row0 + g + 8) * st + k0 + 8 + 2 * c);
}
// B(k, n) = T[n0 + n][k0 + k]   (rows of T are the columns of B)
__device__ __forceinline__ void frag_b_rows(std::uint32_t* b, const bf16* t, int st, int n0, int k0, int g, int c) {
  b[0] = ld32(t + (n0 + g) * st + k0 + 2 * c);
  b[1] = ld32(t + (n0 + g) * st + k0 + 8 + 2 * c);
}
// B(k, n) = T[k0 + k][n0 + n]
__device__ __forceinline__ void frag_b_cols(std::uint32_t* b, const bf16* t, int st, int k0, int n0, int g, int c) {
  b[0] = pack(t[(k0 + 2 * c) * st + n0 + g], t[(k0 + 2 * c + 1) * st + n0 + g]);
  b[1] = pack(t[(k0 + 2 * c + 8) * st + n0 + g], t[(k0 + 2 * c + 9) * st + n0 + g]);
}
// ldmatrix: four 8x8 bf16 matrices of shared memory in one instruction, lane l naming row l % 8 of matrix l / 8;
// the fragments are those frag_b_rows / frag_b_cols read element by element, so the products are the same bits.
// B fragments of n-tiles n0 and n0 + 8: b[0..1] and b[2..3].
//   rows:  B(k, n) = T[n0 + n][k0 + k]   (lane l: row n0 + (l / 16) * 8 + l % 8, column k0 + (l / 8 % 2) * 8)
//   cols:  B(k, n) = T[k0 + k][n0 + n]   (transposed; lane l: row k0 + (l / 8 % 2) * 8 + l % 8, column n0 + (l / 16) * 8)
// Row addresses must be 16-byte aligned (strides and column offsets multiples of 8 elements).
__device__ __forceinline__ void frag_b_rows_x2(std::uint32_t (&b)[4], const bf16* t, int st, int n0, int k0, int lane) {
  const bf16* p = t + (n0 + (lane / 16) * 8 + lane % 8) * st + k0 + (lane / 8 % 2) * 8;
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(at));
}
__device__ __forceinline__ void frag_b_cols_x2(std::uint32_t (&b)[4], const bf16* t, int st, int k0, int n0, int lane) {
  const bf16* p = t + (k0 + (lane / 8 % 2) * 8 + lane % 8) * st + n0 + (lane / 16) * 8;
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(at));
}
// The accumulators of score tiles 2kc and 2kc+1 as the A fragment of keys 16kc..16kc+15.
__device__ __forceinline__ void acc_to_a(std::uint32_t* a, const float* lo, const float* hi) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

// FlashAttention-2's step over a tile of BN keys for a warp's 16 query rows (g and g + 8 of the lane), in three
// parts: the raw scores S = Q K^T (qf: the queries' A fragments over D; sk: the tile's keys, rows of stride st);
// then, with the caller's scale and mask applied (-inf for a masked key), the online softmax: m = the rows' running
// max, l (this lane's share of) the running sum, acc rescaled by e^(m_old - m_new) and sc turned into e^(s - m);
// then acc += P V (sv: the tile's values, rows of stride st; any [BN, D] tile, as dS K in the backward). Base 2:
// the scale holds log2(e). A tile whose keys are all masked leaves the state as it was (m starts at -FLT_MAX, so
// no -inf - -inf arises).
// kLdsm: the B fragments by ldmatrix (the same values; sk, sv and st 16-byte aligned, BN / 8 and D / 8 even).
template <int BN, int D, bool kLdsm = false>
__device__ __forceinline__ void tile_scores(float (&sc)[BN / 8][4], const std::uint32_t (&qf)[D / 16][4],
                                            const bf16* sk, int st, int g, int c) {
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[nt][i] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    if constexpr (kLdsm) {
#pragma unroll
      for (int nt = 0; nt < BN / 8; nt += 2) {
        std::uint32_t bf[4];
        frag_b_rows_x2(bf, sk, st, nt * 8, kc * 16, 4 * g + c);
        mma(sc[nt], qf[kc], bf);
        mma(sc[nt + 1], qf[kc], bf + 2);
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        std::uint32_t bf[2];
        frag_b_rows(bf, sk, st, nt * 8, kc * 16, g, c);
        mma(sc[nt], qf[kc], bf);
      }
    }
  }
}
template <int BN, int D>
__device__ __forceinline__ void online_softmax(float (&sc)[BN / 8][4], float (&m)[2], float (&l)[2],
                                               float (&acc)[D / 8][4]) {
  float mx[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) mx[i / 2] = fmaxf(mx[i / 2], sc[nt][i]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float mn = fmaxf(m[r], mx[r]);
    const float alpha = exp2f(m[r] - mn);
    m[r] = mn;
    l[r] *= alpha;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) acc[nt][2 * r] *= alpha, acc[nt][2 * r + 1] *= alpha;
  }
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sc[nt][i] = exp2f(sc[nt][i] - m[i / 2]);
      l[i / 2] += sc[nt][i];
    }
}
template <int BN, int D, bool kLdsm = false>
__device__ __forceinline__ void accumulate_pv(float (&acc)[D / 8][4], const float (&sc)[BN / 8][4], const bf16* sv,
                                              int st, int g, int c) {
#pragma unroll
  for (int kc = 0; kc < BN / 16; ++kc) {
    std::uint32_t af[4];
    acc_to_a(af, sc[2 * kc], sc[2 * kc + 1]);
    if constexpr (kLdsm) {
#pragma unroll
      for (int nt = 0; nt < D / 8; nt += 2) {
        std::uint32_t bf[4];
        frag_b_cols_x2(bf, sv, st, kc * 16, nt * 8, 4 * g + c);
        mma(acc[nt], af, bf);
        mma(acc[nt + 1], af, bf + 2);
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        std::uint32_t bf[2];
        frag_b_cols(bf, sv, st, kc * 16, nt * 8, g, c);
        mma(acc[nt], af, bf);
      }
    }
  }
}

}  // namespace dlm::train::cuda
