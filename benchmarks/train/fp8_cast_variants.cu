// The transposed FP8 cast through cast_tile8's shared-memory tiles (fp8_cast_variants.h).
#include "backend/cuda/fp8_common.cuh"
#include "fp8_cast_variants.h"

namespace dlm::train::cuda {
namespace {

template <int kCols>
__global__ void __launch_bounds__(kTileThreads) quantize_tiled(const bf16* __restrict__ x, int rows, int cols,
                                                               Fp8Cast c, fp8* __restrict__ out, fp8* __restrict__ out_t) {
  const auto t = fp8_tile<kCols>(rows, cols);
  Bf16x8 v[4];
  if (t.live)
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = *reinterpret_cast<const Bf16x8*>(x + (t.r + j) * cols + t.c);
  cast_tiled<1>(c, t, [&](int j, float (&a)[1][8]) { unpack8(v[j], a[0]); }, rows, cols, cols, 0, out, out_t);
}

}  // namespace

void fp8_quantize_tiled(const bf16* x, int rows, int cols, const Fp8Cast& cast, fp8* out, fp8* out_t, int tile_cols,
                        cudaStream_t stream) {
  if (tile_cols == 64)
    quantize_tiled<64><<<fp8_tile_blocks<64>(rows, cols), kTileThreads, 0, stream>>>(x, rows, cols, cast, out, out_t);
  else
    quantize_tiled<128><<<fp8_tile_blocks<128>(rows, cols), kTileThreads, 0, stream>>>(x, rows, cols, cast, out, out_t);
}

}  // namespace dlm::train::cuda
