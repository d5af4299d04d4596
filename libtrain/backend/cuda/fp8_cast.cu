// FP8 casts: amax, the saturating cast (row-major and/or transposed), the delayed-scaling update, the dequantize
// the tests read. The transposed cast gives the K-contiguous operands Hopper's FP8 GEMMs need in the backward
// (fp8_gemm: both operands K-major): weights for the input gradient, activations and gradients for the weight
// gradient. Math and contracts: fp8_cast.h; scale arithmetic: dlm/train/fp8.h.
#include "dlm/train/fp8.h"
#include "fp8_common.cuh"

namespace dlm::train::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void amax_kernel(const bf16* x, std::int64_t n, Fp8Slot* slot) {
  float m = 0.0f;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < n / 8; v += stride) {
    float a[8];
    unpack8(reinterpret_cast<const Bf16x8*>(x)[v], a);
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(a[i]));
  }
  if (blockIdx.x == 0)
    for (std::int64_t i = n / 8 * 8 + threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  block_amax_commit(m, slot);
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

// Row-major only: eight elements a thread.
__global__ void quantize_rows(const bf16* x, std::int64_t vecs, Fp8Cast c, fp8* out) {
  const float s = cast_scale(c);
  float m = 0.0f;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vecs; v += stride) {
    float a[8];
    unpack8(reinterpret_cast<const Bf16x8*>(x)[v], a);
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(a[i]));
    store_fp8x8(a, s, c.e5m2, out + v * 8);
  }
  if (!c.current) block_amax_commit(m, c.slot);
  store_scale(c, s);
}

// Four fp8 (the low bytes of b[0..3]) as one little-endian word.
__device__ __forceinline__ std::uint32_t word4(const std::uint32_t* b) {
  return b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24);
}

// 16 x 16 elements a thread, in registers: 16 rows of 32 bytes read (whole sectors), cast, each row's 16 bytes
// stored row-major, and the 16 x 16 bytes transposed into 16 stores of 16 bytes, one a column. Consecutive threads
// take consecutive 16-row blocks, so a warp's stores to one row of the transpose are 512 contiguous bytes (a
// shared-memory tile whose threads read single bytes of a column ran at half the bandwidth: fp8_bench).
// rows % 16 == 0, cols % 16 == 0.
constexpr int kBlockThreads = 256;
__global__ void __launch_bounds__(kBlockThreads) quantize_transpose(const bf16* x, int rows, int cols, Fp8Cast c,
                                                                      fp8* out, fp8* out_t) {
  const float s = cast_scale(c);
  const std::int64_t row_blocks = rows / 16, t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float m = 0.0f;
  if (t < row_blocks * (cols / 16)) {
    const std::int64_t r0 = t % row_blocks * 16, c0 = t / row_blocks * 16;
    std::uint32_t tw[16][4];  // tw[column][row / 4]: the transposed bytes
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      std::uint32_t b[4][16];  // rows 4g .. 4g + 3, cast
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::int64_t at = (r0 + 4 * g + j) * cols + c0;
        float a[16];
        unpack8(reinterpret_cast<const Bf16x8*>(x + at)[0], a);
        unpack8(reinterpret_cast<const Bf16x8*>(x + at)[1], a + 8);
#pragma unroll
        for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(a[i])), b[j][i] = to_fp8(a[i] * s, c.e5m2);
        if (out) *reinterpret_cast<uint4*>(out + at) = make_uint4(word4(b[j]), word4(b[j] + 4), word4(b[j] + 8), word4(b[j] + 12));
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
  }
  if (!c.current) block_amax_commit(m, c.slot);
  store_scale(c, s);
}

__global__ void update_delayed(Fp8Slot* slots, float* history, int count, int len, bool algo_max, float margin) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  Fp8Slot& s = slots[i];
  float* h = history + static_cast<std::int64_t>(i) * len;
  for (int j = len - 1; j > 0; --j) h[j] = h[j - 1];
  h[0] = s.amax;
  float amax = h[0];
  if (algo_max)
    for (int j = 1; j < len; ++j) amax = fmaxf(amax, h[j]);
  s.scale = fp8_scale(amax, s.fp8_max, margin, s.scale);
  s.amax = 0.0f;
}

__global__ void dequantize_kernel(const fp8* q, std::int64_t n, bool e5m2, const Fp8Slot* slot, float* out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_fp8(q[i], e5m2) * slot->scale_inv;
}

unsigned grid_for(std::int64_t work) {
  const std::int64_t blocks = (work + kThreads - 1) / kThreads, most = 8LL * multiprocessors();
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < most ? blocks : most));
}

}  // namespace

void fp8_amax(const bf16* x, std::int64_t n, Fp8Slot* slot, cudaStream_t stream) {
  amax_kernel<<<grid_for(n / 8), kThreads, 0, stream>>>(x, n, slot);
}

void fp8_quantize(const bf16* x, int rows, int cols, const Fp8Cast& cast, fp8* out, fp8* out_t, cudaStream_t stream) {
  if (!out_t) {
    const std::int64_t vecs = static_cast<std::int64_t>(rows) * cols / 8;
    quantize_rows<<<grid_for(vecs), kThreads, 0, stream>>>(x, vecs, cast, out);
    return;
  }
  const std::int64_t threads = std::int64_t{rows / 16} * (cols / 16);
  quantize_transpose<<<static_cast<unsigned>((threads + kBlockThreads - 1) / kBlockThreads), kBlockThreads, 0,
                         stream>>>(x, rows, cols, cast, out, out_t);
}

void fp8_update_delayed(Fp8Slot* slots, float* history, int count, int len, bool algo_max, float margin_factor,
                        cudaStream_t stream) {
  if (count > 0) update_delayed<<<(count + 127) / 128, 128, 0, stream>>>(slots, history, count, len, algo_max, margin_factor);
}

void fp8_dequantize(const fp8* q, std::int64_t n, bool e5m2, const Fp8Slot* slot, float* out, cudaStream_t stream) {
  dequantize_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(q, n, e5m2, slot, out);
}

}  // namespace dlm::train::cuda
