// SwiGLU on the fc1 output, rows of [gate | up]:  h = silu(g) * u,  silu(g) = g * sig(g)
//   backward:  dg = dh * u * sig(g) * (1 + g * (1 - sig(g))),  du = dh * silu(g)
// Eight columns a thread, 16-byte accesses; ffn % 8 == 0. The forward may cast h to FP8 as it writes it (Fp8Out,
// fp8_cast.h: the bf16-rounded h, so the cast equals fp8_quantize of h) and max its amax into the slot; the backward
// may max dgu's amax (of its bf16 values) into a slot, for fc1's tensorwise gradient cast. Either may write its output
// in FP8 only, both layouts, cast from the bf16 values it would write (swiglu_forward_fp8: fc2's input,
// swiglu_backward_fp8: fc1's output gradient), delayed with the scale as it stands, tensorwise after a pass that
// takes that output's amax alone (swiglu_forward_amax, swiglu_backward_amax).
#include "common.cuh"
#include "fp8_common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

// Eight columns' gradients, rounded to bf16, from dh, the gate and the up.
__device__ __forceinline__ void grad8(const Bf16x8& d8, const Bf16x8& g8, const Bf16x8& u8, Bf16x8& pg, Bf16x8& pu) {
  float g[8], u[8], d[8], dg[8], du[8];
  unpack8(g8, g), unpack8(u8, u), unpack8(d8, d);
  for (int k = 0; k < 8; ++k) {
    const float sg = 1.0f / (1.0f + __expf(-g[k]));
    dg[k] = d[k] * u[k] * sg * (1.0f + g[k] * (1.0f - sg));
    du[k] = d[k] * g[k] * sg;
  }
  pg = pack8(dg), pu = pack8(du);
}

// Eight columns of h, rounded to bf16, from the gate and the up.
__device__ __forceinline__ Bf16x8 act8(const Bf16x8& g8, const Bf16x8& u8) {
  float g[8], u[8];
  unpack8(g8, g), unpack8(u8, u);
  for (int k = 0; k < 8; ++k) g[k] = g[k] / (1.0f + __expf(-g[k])) * u[k];
  return pack8(g);
}
__device__ __forceinline__ Bf16x8 load8(const bf16* p) { return *reinterpret_cast<const Bf16x8*>(p); }
// A tile thread's inputs (t live), all loads issued before any use: its four rows t.r + j of the gate and the up
// (columns t.c + [0, 8) of each half of gu), and for the backward dh's same four rows; zeros on the pad's rows
// (fp8_padded_rows), whose h and dgu are then zero.
__device__ __forceinline__ void load_gate_up(const bf16* __restrict__ gu, const Fp8Tile<>& t, int ffn,
                                             Bf16x8 (&g)[4], Bf16x8 (&u)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const bf16* p = gu + (t.r + j) * 2 * ffn + t.c;
    g[j] = load8_or_zero(p, t.has_row(j)), u[j] = load8_or_zero(p + ffn, t.has_row(j));
  }
}
__device__ __forceinline__ void load_grad_inputs(const bf16* __restrict__ dh, const bf16* __restrict__ gu,
                                                 const Fp8Tile<>& t, int ffn, Bf16x8 (&d)[4], Bf16x8 (&g)[4],
                                                 Bf16x8 (&u)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) d[j] = load8_or_zero(dh + (t.r + j) * ffn + t.c, t.has_row(j));
  load_gate_up(gu, t, ffn, g, u);
}

// Grid-stride: with an FP8 amax the grid is bounded (grid()), so that each block's one atomic stays few.
__global__ void swiglu_fwd(const bf16* gu, bf16* h, std::int64_t vecs, int ffn, Fp8Out f8) {
  float m = 0.0f;  // the FP8 cast's amax; every thread reaches the block's commit below
  const float scale8 = fused_fp8_scale(f8);
  const int per_row = ffn / 8;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / per_row, col = (i % per_row) * 8;
    const bf16* g8 = gu + row * 2 * ffn + col;
    const Bf16x8 p = act8(load8(g8), load8(g8 + ffn));
    *reinterpret_cast<Bf16x8*>(h + row * ffn + col) = p;
    if (f8.slot) {
      float g[8];
      unpack8(p, g);
      m = fmaxf(m, fused_fp8x8(g, f8, row * ffn + col, scale8));
    }
  }
  fused_fp8_commit(m, f8);
}

__global__ void swiglu_bwd(const bf16* dh, const bf16* gu, bf16* dgu, std::int64_t vecs, int ffn, Fp8Slot* amax) {
  float m = 0.0f;  // max |dgu| written; every thread reaches the block's commit below
  const int per_row = ffn / 8;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / per_row, col = (i % per_row) * 8;
    Bf16x8 pg, pu;
    const bf16* g8 = gu + row * 2 * ffn + col;
    grad8(load8(dh + row * ffn + col), load8(g8), load8(g8 + ffn), pg, pu);
    *reinterpret_cast<Bf16x8*>(dgu + row * 2 * ffn + col) = pg;
    *reinterpret_cast<Bf16x8*>(dgu + row * 2 * ffn + ffn + col) = pu;
    if (amax) m = fmaxf(m, fmaxf(abs_max8(pg), abs_max8(pu)));
  }
  if (amax) block_amax_commit(m, amax);
}

// The forward straight into FP8 (no bf16 h): a block a 64 x 128 tile of h, cast in both layouts (cast_tile8) from
// the bf16 values swiglu_fwd would write.
__global__ void __launch_bounds__(kTileThreads) swiglu_fwd_fp8(const bf16* __restrict__ gu, int rows, int ffn,
                                                               Fp8Cast c, fp8* __restrict__ out, fp8* __restrict__ out_t) {
  const auto t = fp8_tile(blockIdx.x, rows, ffn);
  Bf16x8 g[4], u[4];
  if (t.live) load_gate_up(gu, t, ffn, g, u);
  cast_tiled<1>(c, t, [&](int j, float (&a)[1][8]) { unpack8(act8(g[j], u[j]), a[0]); }, rows, ffn, ffn, 0, out,
                out_t);
}

// The backward straight into FP8 (no bf16 dgu): a block a 64 x 128 tile of the gate's gradient and the same of the
// up's (ffn columns further), cast in both layouts (cast_tile8) from the bf16 values swiglu_bwd would write.
__global__ void __launch_bounds__(kTileThreads) swiglu_bwd_fp8(const bf16* __restrict__ dh, const bf16* __restrict__ gu,
                                                               int rows, int ffn, Fp8Cast c, fp8* __restrict__ out,
                                                               fp8* __restrict__ out_t) {
  const auto t = fp8_tile(blockIdx.x, rows, ffn);
  Bf16x8 d[4], g[4], u[4];
  if (t.live) load_grad_inputs(dh, gu, t, ffn, d, g, u);
  cast_tiled<2>(c, t, [&](int j, float (&a)[2][8]) {
    Bf16x8 pg, pu;
    grad8(d[j], g[j], u[j], pg, pu);
    unpack8(pg, a[0]), unpack8(pu, a[1]);
  }, rows, ffn, 2 * ffn, ffn, out, out_t);
}

// The amax alone of what swiglu_fwd / swiglu_bwd would write (tensorwise, before the kernels above): a thread the
// 4 x 8 of the tiles' mapping (fp8_tile), all its loads issued before its math.
__global__ void __launch_bounds__(kTileThreads) swiglu_fwd_amax(const bf16* __restrict__ gu, int rows, int ffn,
                                                                Fp8Slot* slot) {
  const auto t = fp8_tile(blockIdx.x, rows, ffn);
  float m = 0.0f;
  if (t.live) {
    Bf16x8 g[4], u[4];
    load_gate_up(gu, t, ffn, g, u);
#pragma unroll
    for (int j = 0; j < 4; ++j) m = fmaxf(m, abs_max8(act8(g[j], u[j])));
  }
  block_amax_commit(m, slot);
}
__global__ void __launch_bounds__(kTileThreads) swiglu_bwd_amax(const bf16* __restrict__ dh, const bf16* __restrict__ gu,
                                                                int rows, int ffn, Fp8Slot* slot) {
  const auto t = fp8_tile(blockIdx.x, rows, ffn);
  float m = 0.0f;
  if (t.live) {
    Bf16x8 d[4], g[4], u[4];
    load_grad_inputs(dh, gu, t, ffn, d, g, u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      Bf16x8 pg, pu;
      grad8(d[j], g[j], u[j], pg, pu);
      m = fmaxf(m, fmaxf(abs_max8(pg), abs_max8(pu)));
    }
  }
  block_amax_commit(m, slot);
}

// One thread a vector, or with an amax at most 8 blocks a multiprocessor looping.
unsigned grid(std::int64_t vecs, bool amax) {
  const std::int64_t blocks = (vecs + 255) / 256, most = 8LL * multiprocessors();
  return static_cast<unsigned>(amax && blocks > most ? most : blocks);
}

}  // namespace

void swiglu_forward(const bf16* gu, bf16* h, std::int64_t rows, int ffn, cudaStream_t stream, const Fp8Out* fp8) {
  const std::int64_t vecs = rows * (ffn / 8);
  const Fp8Out f8 = fp8 ? *fp8 : Fp8Out{};
  swiglu_fwd<<<grid(vecs, f8.slot != nullptr), 256, 0, stream>>>(gu, h, vecs, ffn, f8);
}

void swiglu_backward(const bf16* dh, const bf16* gu, bf16* dgu, std::int64_t rows, int ffn, cudaStream_t stream,
                     Fp8Slot* dgu_amax) {
  const std::int64_t vecs = rows * (ffn / 8);
  swiglu_bwd<<<grid(vecs, dgu_amax != nullptr), 256, 0, stream>>>(dh, gu, dgu, vecs, ffn, dgu_amax);
}

void swiglu_backward_fp8(const bf16* dh, const bf16* gu, int rows, int ffn, const Fp8Cast& cast, fp8* out,
                         fp8* out_t, cudaStream_t stream) {
  swiglu_bwd_fp8<<<fp8_tile_blocks(rows, ffn), kTileThreads, 0, stream>>>(dh, gu, rows, ffn, cast, out, out_t);
}

void swiglu_forward_amax(const bf16* gu, int rows, int ffn, Fp8Slot* slot, cudaStream_t stream) {
  swiglu_fwd_amax<<<fp8_tile_blocks(rows, ffn), kTileThreads, 0, stream>>>(gu, rows, ffn, slot);
}

void swiglu_backward_amax(const bf16* dh, const bf16* gu, int rows, int ffn, Fp8Slot* slot, cudaStream_t stream) {
  swiglu_bwd_amax<<<fp8_tile_blocks(rows, ffn), kTileThreads, 0, stream>>>(dh, gu, rows, ffn, slot);
}

void swiglu_forward_fp8(const bf16* gu, int rows, int ffn, const Fp8Cast& cast, fp8* out, fp8* out_t,
                        cudaStream_t stream) {
  swiglu_fwd_fp8<<<fp8_tile_blocks(rows, ffn), kTileThreads, 0, stream>>>(gu, rows, ffn, cast, out, out_t);
}

}  // namespace dlm::train::cuda
