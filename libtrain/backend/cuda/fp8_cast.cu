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

// A block a 64 x 128 tile (fp8_tile, cast_tiled). Any rows, cols % 8 == 0.
__global__ void __launch_bounds__(kTileThreads) quantize_transpose(const bf16* __restrict__ x, int rows, int cols,
                                                                   Fp8Cast c, fp8* __restrict__ out,
                                                                   fp8* __restrict__ out_t) {
  const auto t = fp8_tile(blockIdx.x, rows, cols);
  Bf16x8 v[4];
  if (t.live)
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = load8_or_zero(x + (t.r + j) * cols + t.c, t.has_row(j));
  cast_tiled<1>(c, t, [&](int j, float (&a)[1][8]) { unpack8(v[j], a[0]); }, rows, cols, cols, 0, out, out_t);
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
  quantize_transpose<<<fp8_tile_blocks(rows, cols), kTileThreads, 0, stream>>>(x, rows, cols, cast, out, out_t);
}

void fp8_update_delayed(Fp8Slot* slots, float* history, int count, int len, bool algo_max, float margin_factor,
                        cudaStream_t stream) {
  if (count > 0) update_delayed<<<(count + 127) / 128, 128, 0, stream>>>(slots, history, count, len, algo_max, margin_factor);
}

void fp8_dequantize(const fp8* q, std::int64_t n, bool e5m2, const Fp8Slot* slot, float* out, cudaStream_t stream) {
  dequantize_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(q, n, e5m2, slot, out);
}

}  // namespace dlm::train::cuda
