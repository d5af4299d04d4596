// The transposed FP8 cast's other kernels (fp8_cast_variants.cu), with the library's contract (backend/cuda/fp8_cast.h:
// fp8_quantize with out_t set), timed beside it by fp8_bench. The library's: a block a 64 x 128 tile through shared
// memory (fp8_common.cuh: cast_tile8).
#pragma once

#include "backend/cuda/fp8_cast.h"

namespace dlm::train::cuda {
// A block a 128 x 64 tile through shared memory (transposed stores in runs of 128 bytes, row-major ones of 64).
// rows % 16 == 0, cols % 8 == 0.
void fp8_quantize_tiled_128x64(const bf16* x, int rows, int cols, const Fp8Cast& cast, fp8* out, fp8* out_t,
                               cudaStream_t stream);
// 64 x 128 tiles, a block looping over them with the next tile's loads issued before the current one's stores.
// rows % 16 == 0, cols % 8 == 0.
void fp8_quantize_tiled_looping(const bf16* x, int rows, int cols, const Fp8Cast& cast, fp8* out, fp8* out_t,
                                cudaStream_t stream);
// A thread a 16 x 16 block in registers, transposed by bytes into 16 column stores of 16 bytes (no shared memory):
// the library's before the tiles. rows % 16 == 0, cols % 16 == 0.
void fp8_quantize_blocks16(const bf16* x, int rows, int cols, const Fp8Cast& cast, fp8* out, fp8* out_t,
                           cudaStream_t stream);
}  // namespace dlm::train::cuda
