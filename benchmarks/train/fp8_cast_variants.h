// The transposed FP8 cast's other kernels (fp8_cast_variants.cu), with the library's contract (backend/cuda/fp8_cast.h:
// fp8_quantize with out_t set), timed beside it by fp8_bench.
#pragma once

#include "backend/cuda/fp8_cast.h"

namespace dlm::train::cuda {
// A block a tile through shared memory (fp8_common.cuh: cast_tile8, the tiling of SwiGLU's FP8 kernels), of
// tile_cols 128 (64 x 128) or 64 (128 x 64), instead of the library's thread a 16 x 16 block in registers.
// rows % 16 == 0, cols % 8 == 0.
void fp8_quantize_tiled(const bf16* x, int rows, int cols, const Fp8Cast& cast, fp8* out, fp8* out_t, int tile_cols,
                        cudaStream_t stream);
}  // namespace dlm::train::cuda
