// The transposed FP8 cast's other kernels (fp8_cast_variants.h): 128 x 64 tiles, 64 x 128 tiles a block looping,
// and 16 x 16 blocks in registers.
#include "backend/cuda/fp8_common.cuh"
#include "fp8_cast_variants.h"

namespace dlm::train::cuda {
namespace {

__global__ void __launch_bounds__(kTileThreads) quantize_tiled_128x64(const bf16* __restrict__ x, int rows, int cols,
                                                                      Fp8Cast c, fp8* __restrict__ out,
                                                                      fp8* __restrict__ out_t) {
  const auto t = fp8_tile<64>(blockIdx.x, rows, cols);
  Bf16x8 v[4];
  if (t.live)
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = *reinterpret_cast<const Bf16x8*>(x + (t.r + j) * cols + t.c);
  cast_tiled<1>(c, t, [&](int j, float (&a)[1][8]) { unpack8(v[j], a[0]); }, rows, cols, cols, 0, out, out_t);
}

// Four fp8 (the low bytes of b[0..3]) as one little-endian word.
__device__ __forceinline__ std::uint32_t word4(const std::uint32_t* b) {
  return b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24);
}
// One thread's 16 x 16 block at (r0, c0) of a [rows, cols] tensor cast with `scale` into out [rows, cols] (may be
// null) and out_t [cols, rows], in registers: row(j, v) gives the block's row j (16 values, as the bf16 tensor holds
// them), each row's 16 bytes are stored row-major and the 16 x 16 bytes transposed into 16 stores of 16 bytes, one
// a column (no shared-memory tile read a byte at a time). Returns the block's max |value|.
template <typename Row>
__device__ __forceinline__ float cast_block16(Row row, std::int64_t r0, std::int64_t c0, std::int64_t rows,
                                              std::int64_t cols, float scale, bool e5m2, fp8* out, fp8* out_t) {
  float m = 0.0f;
  std::uint32_t tw[16][4];  // tw[column][row / 4]: the transposed bytes
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    std::uint32_t b[4][16];  // rows 4g .. 4g + 3, cast
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float a[16];
      row(4 * g + j, a);
#pragma unroll
      for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(a[i])), b[j][i] = to_fp8(a[i] * scale, e5m2);
      if (out)
        *reinterpret_cast<uint4*>(out + (r0 + 4 * g + j) * cols + c0) =
            make_uint4(word4(b[j]), word4(b[j] + 4), word4(b[j] + 8), word4(b[j] + 12));
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const std::uint32_t col[4] = {b[0][i], b[1][i], b[2][i], b[3][i]};
      tw[i][g] = word4(col);
    }
  }
#pragma unroll
  for (int i = 0; i < 16; ++i)
    *reinterpret_cast<uint4*>(out_t + (c0 + i) * rows + r0) = make_uint4(tw[i][0], tw[i][1], tw[i][2], tw[i][3]);
  return m;
}
// The body of a kernel of one thread a 16 x 16 block of a [rows, 16 block_cols] tensor: block(r0, c0, scale) casts
// the thread's block (cast_block16) and returns its max |value|; the cast's scale is derived and stored, the amax
// recorded (delayed), as every cast does. A warp takes 4 row blocks by 8 column blocks, so that its loads are runs
// of 256 bytes of a row, its stores runs of 128 bytes of a row and of 64 of a row of the transpose (a warp down 32
// row blocks would read 32-byte pieces of 32 rows, which DRAM serves far below its bandwidth: fp8_bench).
constexpr int kGridRowBlocks = 4, kGridColBlocks = 8;  // a warp's
__device__ __forceinline__ void cast_grid16_block(int rows, std::int64_t block_cols, std::int64_t& r0, std::int64_t& c0) {
  const std::int64_t row_groups = (rows / 16 + kGridRowBlocks - 1) / kGridRowBlocks,
                     warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  r0 = (warp % row_groups * kGridRowBlocks + lane % kGridRowBlocks) * 16;
  c0 = (warp / row_groups * kGridColBlocks + lane / kGridRowBlocks) * 16;
  if (r0 >= rows || c0 >= block_cols * 16) r0 = c0 = -1;  // past the tensor
}
template <typename Block>
__device__ __forceinline__ void cast_grid16(const Fp8Cast& c, int rows, std::int64_t block_cols, Block block) {
  const float s = cast_scale(c);
  std::int64_t r0, c0;
  cast_grid16_block(rows, block_cols, r0, c0);
  const float m = r0 >= 0 ? block(r0, c0, s) : 0.0f;
  if (!c.current) block_amax_commit(m, c.slot);
  store_scale(c, s);
}
// The grid of 256-thread blocks a cast_grid16 kernel takes for [rows, 16 block_cols].
inline unsigned cast_grid16_blocks(int rows, std::int64_t block_cols) {
  const std::int64_t warps = (rows / 16 + kGridRowBlocks - 1) / kGridRowBlocks *
                             ((block_cols + kGridColBlocks - 1) / kGridColBlocks);
  return static_cast<unsigned>((warps + 7) / 8);
}

__global__ void __launch_bounds__(256) quantize_blocks16(const bf16* x, int rows, int cols, Fp8Cast c, fp8* out,
                                                         fp8* out_t) {
  cast_grid16(c, rows, cols / 16, [&](std::int64_t r0, std::int64_t c0, float s) {
    return cast_block16(
        [&](int j, float* a) {
          const bf16* p = x + (r0 + j) * cols + c0;
          unpack8(reinterpret_cast<const Bf16x8*>(p)[0], a);
          unpack8(reinterpret_cast<const Bf16x8*>(p)[1], a + 8);
        },
        r0, c0, rows, cols, s, c.e5m2, out, out_t);
  });
}

// 64 x 128 tiles, a block looping over them (as many blocks as fit at once): the next tile's loads are issued
// before the current tile's cast and stores, so that a block's loads stay in flight while it stores.
__global__ void __launch_bounds__(kTileThreads) quantize_tiled_looping(const bf16* __restrict__ x, int rows, int cols,
                                                                       Fp8Cast c, fp8* __restrict__ out,
                                                                       fp8* __restrict__ out_t) {
  const float s = cast_scale(c);
  const std::int64_t tiles = fp8_tile_blocks(rows, cols);
  auto load = [&](const Fp8Tile<>& t, Bf16x8* v) {
    if (t.live)
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = *reinterpret_cast<const Bf16x8*>(x + (t.r + j) * cols + t.c);
  };
  std::int64_t tile = blockIdx.x;
  auto t = fp8_tile(tile, rows, cols);
  Bf16x8 next[4];
  load(t, next);
  float m = 0.0f;
  for (; tile < tiles; tile += gridDim.x) {
    Bf16x8 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = next[j];
    const auto t_next = fp8_tile(tile + gridDim.x, rows, cols);
    if (tile + gridDim.x < tiles) load(t_next, next);
    m = fmaxf(m, cast_tile8<1>(t, [&](int j, float (&a)[1][8]) { unpack8(v[j], a[0]); }, rows, cols, cols, 0, s,
                               c.e5m2, out, out_t));
    __syncthreads();  // the shared tile is the next one's
    t = t_next;
  }
  if (!c.current) block_amax_commit(m, c.slot);
  store_scale(c, s);
}

}  // namespace

void fp8_quantize_tiled_looping(const bf16* x, int rows, int cols, const Fp8Cast& cast, fp8* out, fp8* out_t,
                                cudaStream_t stream) {
  static int per_sm = 0;
  if (!per_sm)
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, quantize_tiled_looping, kTileThreads, 0),
               "occupancy");
  const unsigned tiles = fp8_tile_blocks(rows, cols), most = static_cast<unsigned>(per_sm * multiprocessors());
  quantize_tiled_looping<<<tiles < most ? tiles : most, kTileThreads, 0, stream>>>(x, rows, cols, cast, out, out_t);
}

void fp8_quantize_tiled_128x64(const bf16* x, int rows, int cols, const Fp8Cast& cast, fp8* out, fp8* out_t,
                               cudaStream_t stream) {
  quantize_tiled_128x64<<<fp8_tile_blocks<64>(rows, cols), kTileThreads, 0, stream>>>(x, rows, cols, cast, out, out_t);
}

void fp8_quantize_blocks16(const bf16* x, int rows, int cols, const Fp8Cast& cast, fp8* out, fp8* out_t,
                           cudaStream_t stream) {
  quantize_blocks16<<<cast_grid16_blocks(rows, cols / 16), 256, 0, stream>>>(x, rows, cols, cast, out, out_t);
}

}  // namespace dlm::train::cuda
