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
  warp_amax_commit(m, slot);
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
  if (!c.current) warp_amax_commit(m, c.slot);
  store_scale(c, s);
}

// 64 x 64 tiles through shared memory, 256 threads: each thread reads two 16-byte vectors of a tile's rows (and
// writes their row-major cast, 8 bytes each), then 16 bytes of one column of the tile as a row of the transpose: a
// column's 64 bytes are four threads' consecutive stores. Rows and columns beyond the tensor are skipped whole
// (cols % 8 == 0, rows % 16 == 0).
constexpr int kTile = 64, kTileThreads = 256;
__global__ void __launch_bounds__(kTileThreads) quantize_transpose(const bf16* x, int rows, int cols, Fp8Cast c,
                                                                   fp8* out, fp8* out_t) {
  __shared__ __align__(16) fp8 tile[kTile][kTile + 8];  // rows of 72 bytes: 8-byte stores stay aligned
  const float s = cast_scale(c);
  const int r0 = blockIdx.y * kTile, c0 = blockIdx.x * kTile;
  float m = 0.0f;
  for (int v = threadIdx.x; v < kTile * kTile / 8; v += kTileThreads) {
    const int lr = v / (kTile / 8), lc = v % (kTile / 8) * 8, r = r0 + lr, col = c0 + lc;
    union {
      fp8 b[8];
      uint2 u;
    } p;
    p.u = make_uint2(0, 0);
    if (r < rows && col < cols) {
      const std::int64_t at = static_cast<std::int64_t>(r) * cols + col;
      float a[8];
      unpack8(*reinterpret_cast<const Bf16x8*>(x + at), a);
      for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(a[i])), p.b[i] = to_fp8(a[i] * s, c.e5m2);
      if (out) *reinterpret_cast<uint2*>(out + at) = p.u;
    }
    *reinterpret_cast<uint2*>(&tile[lr][lc]) = p.u;
  }
  __syncthreads();
  const int lc = threadIdx.x / 4, lr = threadIdx.x % 4 * 16, col = c0 + lc, r = r0 + lr;
  if (out_t && col < cols && r < rows) {
    union {
      fp8 b[16];
      uint4 u;
    } q;
    for (int i = 0; i < 16; ++i) q.b[i] = tile[lr + i][lc];
    *reinterpret_cast<uint4*>(out_t + static_cast<std::int64_t>(col) * rows + r) = q.u;
  }
  if (!c.current) warp_amax_commit(m, c.slot);
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
  const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile);
  quantize_transpose<<<grid, kTileThreads, 0, stream>>>(x, rows, cols, cast, out, out_t);
}

void fp8_update_delayed(Fp8Slot* slots, float* history, int count, int len, bool algo_max, float margin_factor,
                        cudaStream_t stream) {
  if (count > 0) update_delayed<<<(count + 127) / 128, 128, 0, stream>>>(slots, history, count, len, algo_max, margin_factor);
}

void fp8_dequantize(const fp8* q, std::int64_t n, bool e5m2, const Fp8Slot* slot, float* out, cudaStream_t stream) {
  dequantize_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(q, n, e5m2, slot, out);
}

}  // namespace dlm::train::cuda
