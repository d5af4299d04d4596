// Device helpers of the FP8 casts (fp8_cast.cu and the producers that fuse a cast or an amax: rmsnorm.cu, swiglu.cu).
#pragma once

#include <cuda_fp8.h>

#include "common.cuh"
#include "dlm/train/fp8.h"
#include "fp8_cast.h"

namespace dlm::train::cuda {

// Saturating: beyond +-max (and +-inf) gives +-max; NaN stays NaN.
__device__ __forceinline__ fp8 to_fp8(float v, bool e5m2) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}
__device__ __forceinline__ float from_fp8(fp8 q, bool e5m2) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(q, e5m2 ? __NV_E5M2 : __NV_E4M3);
  return __half2float(__half(h));
}
// Eight values scaled and cast, stored in one 8-byte access (dst 8-byte aligned).
__device__ __forceinline__ void store_fp8x8(const float* v, float scale, bool e5m2, fp8* dst) {
  union {
    fp8 b[8];
    uint2 u;
  } p;
  for (int i = 0; i < 8; ++i) p.b[i] = to_fp8(v[i] * scale, e5m2);
  *reinterpret_cast<uint2*>(dst) = p.u;
}
// *addr = max(*addr, v) for non-negative floats (their bit patterns order as integers); NaN is skipped. The value
// only grows, so a v not above what L2 holds now (never above the final value) needs no atomic: most of a tensor's
// blocks queue none on the one address.
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  if (v > 0.0f && v > __ldcg(addr)) atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
}
// The warp's largest `v` max-ed into slot->amax by its first lane (every lane of the warp must call).
__device__ __forceinline__ void warp_amax_commit(float v, Fp8Slot* slot) {
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) atomic_max_nonneg(&slot->amax, v);
}
// The largest |value| of eight bf16 (NaN ignored, as fp8_amax ignores it): a producer's amax of what it wrote.
__device__ __forceinline__ float abs_max8(const Bf16x8& p) {
  float f[8], m = 0.0f;
  unpack8(p, f);
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(f[i]));
  return m;
}
// The block's largest `v` max-ed into slot->amax by its first thread: one atomic a block (atomics on one address
// serialize: a warp's each would be tens of thousands a tensor). Every thread of the block calls it once, at most
// once a kernel (blockDim.x a multiple of 32, at most 1024).
__device__ __forceinline__ void block_amax_commit(float v, Fp8Slot* slot) {
  __shared__ float warps_max[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  if (lane == 0) warps_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_max(lane < static_cast<int>(blockDim.x >> 5) ? warps_max[lane] : 0.0f);
    if (lane == 0) atomic_max_nonneg(&slot->amax, v);
  }
}
// The cast's scale (see Fp8Cast); the first thread of the grid stores it and its inverse.
__device__ __forceinline__ float cast_scale(const Fp8Cast& c) {
  const float s = c.current ? fp8_scale(c.slot->amax, c.slot->fp8_max, c.margin_factor, c.slot->scale) : c.slot->scale;
  return s;
}
__device__ __forceinline__ void store_scale(const Fp8Cast& c, float s) {
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
    if (c.current) c.slot->scale = s;
    c.slot->scale_inv = 1.0f / s;
  }
}

// The tiled cast into both layouts, of a bf16 tensor (fp8_cast.cu: the transposed cast) or of a producer that
// writes its output straight into FP8 (swiglu.cu): a 256-thread block casts a kRows x kCols tile of the output
// (kCols 128: 64 x 128, the library's; 64: 128 x 64), a thread rows 4 (t / (kCols / 8)) + [0, 4) by columns
// 8 (t % (kCols / 8)) + [0, 8) of it, so that a warp's loads are runs of 2 kCols bytes of a row and its row-major
// stores runs of kCols bytes. The transpose goes through shared memory: each
// thread turns its 4 x 4 byte squares into column words (byte_perm), the block stores them by column, and reads them
// back 16 bytes (16 rows) at a time, so that the transposed stores are runs of kRows bytes of a row of out_t. Each
// thread loads all of its inputs before its first store (the producer loads them into registers, then cast_tile8
// asks it for the values), so that its loads are all in flight together.
constexpr int kTileThreads = 256;
template <int kCols_ = 128>
struct Fp8Tile {
  static constexpr int kCols = kCols_, kColThreads = kCols / 8, kRows = 4 * kTileThreads / kColThreads;
  static_assert(kCols == 64 || kCols == 128, "a 64 x 128 or 128 x 64 tile");
  std::int64_t row0, col0;  // the block's tile
  std::int64_t r, c;        // the thread's first row and column
  int rows;                 // the tensor's
  bool live;                // the thread's 4 x 8 lie inside the tensor padded to fp8_padded_rows (cols % 8 == 0)
  // Whether the thread's row j (0..3) is one of the tensor's (not the pad's): only those are loaded.
  __device__ __forceinline__ bool has_row(int j) const { return r + j < rows; }
};
// Tile `tile` of a [rows, cols] tensor (fp8_tile_blocks of them, row-major), as the calling thread takes it.
// A tile's rows (64 or 128) are a multiple of 16: the pad of fp8_padded_rows lies in the tensor's last tile.
template <int kCols = 128>
__device__ __forceinline__ Fp8Tile<kCols> fp8_tile(std::int64_t tile, int rows, int cols) {
  using T = Fp8Tile<kCols>;
  const std::int64_t tiles_c = (cols + kCols - 1) / kCols;
  T t;
  t.row0 = tile / tiles_c * T::kRows, t.col0 = tile % tiles_c * kCols;
  t.r = t.row0 + 4 * (threadIdx.x / T::kColThreads), t.c = t.col0 + 8 * (threadIdx.x % T::kColThreads);
  t.rows = rows;
  t.live = t.r < fp8_padded_rows(rows) && t.c < cols;
  return t;
}
template <int kCols = 128>
__host__ __device__ inline unsigned fp8_tile_blocks(int rows, int cols) {
  constexpr int kRows = Fp8Tile<kCols>::kRows;
  return static_cast<unsigned>(static_cast<std::int64_t>((rows + kRows - 1) / kRows) * ((cols + kCols - 1) / kCols));
}
// Eight bf16 at p, or zeros where `in` is false (a pad row: p is not read).
__device__ __forceinline__ Bf16x8 load8_or_zero(const bf16* p, bool in) {
  if (in) return *reinterpret_cast<const Bf16x8*>(p);
  const float zeros[8] = {};
  return pack8(zeros);
}
// Column j of four words (rows 0..3, byte i of each = column i) as a word of its four rows' bytes.
__device__ __forceinline__ void transpose4x4(const std::uint32_t* w, std::uint32_t* col) {
  const std::uint32_t a = __byte_perm(w[0], w[1], 0x5140), b = __byte_perm(w[0], w[1], 0x7362),
                      c = __byte_perm(w[2], w[3], 0x5140), d = __byte_perm(w[2], w[3], 0x7362);
  col[0] = __byte_perm(a, c, 0x5410), col[1] = __byte_perm(a, c, 0x7632);
  col[2] = __byte_perm(b, d, 0x5410), col[3] = __byte_perm(b, d, 0x7632);
}
// Four values scaled and cast as one word (byte i = value i).
__device__ __forceinline__ std::uint32_t fp8x4(const float* v, float scale, bool e5m2) {
  const __nv_fp8_interpretation_t f = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const std::uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0] * scale, v[1] * scale), __NV_SATFINITE, f),
                      hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2] * scale, v[3] * scale), __NV_SATFINITE, f);
  return lo | (hi << 16);
}
// The tile `t` of kOuts outputs of a producer over [rows, cols], cast with `scale`: values(j, a) gives the thread's
// row j (0..3) of output k in a[k] (8 values, as the bf16 tensor holds them; asked only of live threads, and taken
// as zeros on the pad's rows, t.has_row(j) false). Output k is columns k * out_stride + [0, cols) of out [rows, ld]
// (may be null; the pad's rows are not written) and rows k * out_stride + [0, cols) of out_t [ld, Tp], Tp =
// fp8_padded_rows(rows), whose columns [rows, Tp) are written zero. Any rows, cols % 8 == 0. Every thread of the
// block calls it. Returns the thread's max |value|.
template <int kOuts, int kCols, typename Values>
__device__ __forceinline__ float cast_tile8(const Fp8Tile<kCols>& t, Values values, int rows, int cols,
                                            std::int64_t ld, std::int64_t out_stride, float scale, bool e5m2, fp8* out,
                                            fp8* out_t) {
  using T = Fp8Tile<kCols>;
  constexpr int kWords = T::kRows / 4, kChunks = kWords / 4;  // a tile column's: 4 rows a word, 16 a chunk
  // cols_t[k][c][w]: tile column c's rows 4w .. 4w + 3, the 16-byte chunk w / 4 stored at chunk (w / 4) ^ swz(c) so
  // that a warp's column stores spread over the banks (8 of 32 at 64 x 128, all 32 at 128 x 64) and the 16-byte
  // reads stay conflict-free.
  __shared__ alignas(16) std::uint32_t cols_t[kOuts][kCols][kWords];
  const auto swz = [](int c) { return (c >> 3) & (kChunks - 1); };
  float m = 0.0f;
  const int rg = threadIdx.x / T::kColThreads, c8 = 8 * (threadIdx.x % T::kColThreads);
  if (t.live) {
    std::uint32_t w[kOuts][2][4];  // [output][column half][row]
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float a[kOuts][8];
      values(j, a);
      const bool in = t.has_row(j);
#pragma unroll
      for (int k = 0; k < kOuts; ++k) {
#pragma unroll
        for (int i = 0; i < 8; ++i) a[k][i] = in ? a[k][i] : 0.0f, m = fmaxf(m, fabsf(a[k][i]));
        w[k][0][j] = fp8x4(a[k], scale, e5m2), w[k][1][j] = fp8x4(a[k] + 4, scale, e5m2);
        if (out && in)
          *reinterpret_cast<uint2*>(out + (t.r + j) * ld + k * out_stride + t.c) = make_uint2(w[k][0][j], w[k][1][j]);
      }
    }
#pragma unroll
    for (int k = 0; k < kOuts; ++k)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        std::uint32_t col[4];
        transpose4x4(w[k][h], col);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = c8 + 4 * h + i;
          cols_t[k][c][(((rg >> 2) ^ swz(c)) << 2) | (rg & 3)] = col[i];
        }
      }
  }
  __syncthreads();
  const std::int64_t padded = fp8_padded_rows(rows);
#pragma unroll
  for (int k = 0; k < kOuts; ++k)
#pragma unroll
    for (int it = 0; it < kCols * kChunks / kTileThreads; ++it) {
      const int idx = it * kTileThreads + threadIdx.x, c = idx / kChunks, q = idx % kChunks;
      const std::int64_t col = t.col0 + c, row = t.row0 + 16 * q;
      if (col < cols && row < padded)
        *reinterpret_cast<uint4*>(out_t + (k * out_stride + col) * padded + row) =
            reinterpret_cast<const uint4*>(cols_t[k][c])[q ^ swz(c)];
    }
  return m;
}
// The body of a tiled kernel: the cast's scale derived (Fp8Cast), the tile cast (cast_tile8), the amax recorded
// (delayed) and the scale stored, as every cast does.
template <int kOuts, int kCols, typename Values>
__device__ __forceinline__ void cast_tiled(const Fp8Cast& c, const Fp8Tile<kCols>& t, Values values, int rows,
                                           int cols, std::int64_t ld, std::int64_t out_stride, fp8* out, fp8* out_t) {
  const float s = cast_scale(c);
  const float m = cast_tile8<kOuts>(t, values, rows, cols, ld, out_stride, s, c.e5m2, out, out_t);
  if (!c.current) block_amax_commit(m, c.slot);
  store_scale(c, s);
}
// A fused producer's cast scale (slot->scale where it casts, read before the producer's own work so that the load
// is not a round trip after it).
__device__ __forceinline__ float fused_fp8_scale(const Fp8Out& f) { return f.out ? f.slot->scale : 0.0f; }
// A fused producer's cast of its eight outputs (Fp8Out) with `scale` (fused_fp8_scale's): the cast when out is set.
// Returns the eight's largest |value| (where f.amax) for the caller's fused_fp8_commit.
__device__ __forceinline__ float fused_fp8x8(const float* v, const Fp8Out& f, std::int64_t offset, float scale) {
  float m = 0.0f;
  if (f.amax)
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
  if (f.out) store_fp8x8(v, scale, f.e5m2, f.out + offset);
  return m;
}
// A fused producer's first thread records the inverse of the scale it cast with (delayed).
__device__ __forceinline__ void fused_fp8_scale_inv(const Fp8Out& f) {
  if (f.out && blockIdx.x == 0 && threadIdx.x == 0) f.slot->scale_inv = 1.0f / f.slot->scale;
}
// The end of a fused producer's block (every thread calls it, f alike in all): its amax max-ed into the slot and
// the scale's inverse recorded, unless f.amax is off.
__device__ __forceinline__ void fused_fp8_commit(float m, const Fp8Out& f) {
  if (f.slot && f.amax) block_amax_commit(m, f.slot), fused_fp8_scale_inv(f);
}

}  // namespace dlm::train::cuda
