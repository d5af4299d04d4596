// Fused residual add + RMSNorm, forward and backward.
//   s = x + add;  rstd = 1 / sqrt(mean(s^2) + eps);  y = s * rstd * w
//   backward, with g = dy * w and xh = s * rstd:  ds = rstd * (g - xh * mean(g * xh));  dw = sum_rows dy * xh
//   dres <- bf16(dres + ds): the residual gradient is bf16 (Megatron's choice): one buffer is both the sum and
//   the next GEMMs' input, 8 bytes an element a norm moved instead of 14 for an fp32 sum with a bf16 copy.
// The residual sum s is rounded to bf16 before it is normalised, so that the backward sees exactly what
// the forward normalised. The forward may cast y to FP8 as it writes it (Fp8Out, fp8_cast.h: the bf16-rounded y,
// so the cast equals fp8_quantize of y) and max its amax into the slot; the backward may max dres's amax (of the
// bf16 values it writes, so it equals fp8_amax of dres) into a slot: the tensorwise scale of the FP8 gradient the
// next linear layer's backward casts from dres. Weight gradients are summed per block into fixed columns of shared
// memory and then over blocks in a fixed order: the result does not depend on scheduling (deterministic mode free).
#include <algorithm>

#include "common.cuh"
#include "fp8_common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kThreads = 256;
// The looping and warp forms' grid: two blocks a multiprocessor.
int max_blocks() { return 2 * multiprocessors(); }

__global__ void __launch_bounds__(kThreads) rmsnorm_fwd(const bf16* x, const bf16* add, bf16* s_out, const float* w,
                                                        bf16* y, float* rstd, int dim, float eps, Fp8Out f8) {
  __shared__ float scratch[32];
  const float scale8 = fused_fp8_scale(f8);
  const std::int64_t row = blockIdx.x;
  const auto* xr = reinterpret_cast<const Bf16x8*>(x + row * dim);
  const auto* ar = add ? reinterpret_cast<const Bf16x8*>(add + row * dim) : nullptr;
  auto* sr = reinterpret_cast<Bf16x8*>(s_out + row * dim);
  const int vecs = dim / 8;
  float ss = 0.0f;
  for (int v = threadIdx.x; v < vecs; v += kThreads) {
    float a[8];
    Bf16x8 p = xr[v];
    if (ar) {
      float b[8];
      unpack8(p, a);
      unpack8(ar[v], b);
      for (int i = 0; i < 8; ++i) a[i] += b[i];
      p = pack8(a);
      sr[v] = p;
    }
    unpack8(p, a);
    for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
  }
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  const Bf16x8* src = ar ? sr : xr;
  auto* yr = reinterpret_cast<Bf16x8*>(y + row * dim);
  float m = 0.0f;
  for (int v = threadIdx.x; v < vecs; v += kThreads) {
    float a[8];
    unpack8(src[v], a);
    for (int i = 0; i < 8; ++i) a[i] *= r * w[v * 8 + i];
    const Bf16x8 p = pack8(a);
    yr[v] = p;
    if (f8.slot) {
      unpack8(p, a);
      m = fmaxf(m, fused_fp8x8(a, f8, row * dim + v * 8, scale8));
    }
  }
  fused_fp8_commit(m, f8);
}

// The forward with blockDim = dim / 8 (a multiple of 32, at most 1024): a thread's 8 elements stay in registers
// between the sum of squares and the scaling, and no thread of the block is idle (the form above leaves half of
// its 256 threads without a vector at dim 1024 and reads the row twice).
__global__ void __launch_bounds__(1024) rmsnorm_fwd_vec(const bf16* x, const bf16* add, bf16* s_out, const float* w,
                                                        bf16* y, float* rstd, int dim, float eps, Fp8Out f8) {
  __shared__ float scratch[32];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * dim;
  const int v = threadIdx.x;
  // The weights and the FP8 scale loaded with x: they would otherwise be a memory round trip after the reduction.
  const float4 w0 = reinterpret_cast<const float4*>(w)[2 * v], w1 = reinterpret_cast<const float4*>(w)[2 * v + 1];
  const float scale8 = fused_fp8_scale(f8);
  float a[8];
  unpack8(reinterpret_cast<const Bf16x8*>(x + base)[v], a);
  if (add) {
    float b[8];
    unpack8(reinterpret_cast<const Bf16x8*>(add + base)[v], b);
    for (int i = 0; i < 8; ++i) a[i] += b[i];
    const Bf16x8 p = pack8(a);
    reinterpret_cast<Bf16x8*>(s_out + base)[v] = p;
    unpack8(p, a);  // normalise what the backward will read: the rounded sum
  }
  float ss = 0.0f;
  for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  for (int i = 0; i < 8; ++i) a[i] *= r * wv[i];
  const Bf16x8 p = pack8(a);
  reinterpret_cast<Bf16x8*>(y + base)[v] = p;
  float m = 0.0f;  // the FP8 cast's amax
  if (f8.slot) {
    unpack8(p, a);
    m = fused_fp8x8(a, f8, base + v * 8, scale8);
  }
  fused_fp8_commit(m, f8);
}

__global__ void __launch_bounds__(kThreads) rmsnorm_bwd(const bf16* dy, const bf16* s, const float* w,
                                                        const float* rstd, bf16* dres, bool accumulate,
                                                        float* partial, int rows, int dim, Fp8Slot* amax) {
  extern __shared__ float dw_acc[];
  __shared__ float scratch[32];
  const int vecs = dim / 8;
  float m = 0.0f;  // max |dres| written (amax)
  for (int v = threadIdx.x; v < vecs; v += kThreads)
    for (int i = 0; i < 8; ++i) dw_acc[v * 8 + i] = 0.0f;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const float r = rstd[row];
    const auto* dyr = reinterpret_cast<const Bf16x8*>(dy + static_cast<std::int64_t>(row) * dim);
    const auto* sr = reinterpret_cast<const Bf16x8*>(s + static_cast<std::int64_t>(row) * dim);
    float dot = 0.0f;
    for (int v = threadIdx.x; v < vecs; v += kThreads) {
      float d[8], x[8];
      unpack8(dyr[v], d);
      unpack8(sr[v], x);
      for (int i = 0; i < 8; ++i) dot += d[i] * w[v * 8 + i] * x[i] * r;
    }
    dot = block_sum(dot, scratch) / static_cast<float>(dim);
    auto* db = reinterpret_cast<Bf16x8*>(dres + static_cast<std::int64_t>(row) * dim);
    for (int v = threadIdx.x; v < vecs; v += kThreads) {
      float d[8], x[8], acc[8] = {};
      unpack8(dyr[v], d);
      unpack8(sr[v], x);
      if (accumulate) unpack8(db[v], acc);
      for (int i = 0; i < 8; ++i) {
        const float xh = x[i] * r;
        acc[i] += r * (d[i] * w[v * 8 + i] - xh * dot);
        dw_acc[v * 8 + i] += d[i] * xh;
      }
      const Bf16x8 p = pack8(acc);
      db[v] = p;
      m = fmaxf(m, abs_max8(p));
    }
  }
  if (amax) block_amax_commit(m, amax);
  for (int v = threadIdx.x; v < vecs; v += kThreads)
    for (int i = 0; i < 8; ++i) partial[static_cast<std::int64_t>(blockIdx.x) * dim + v * 8 + i] = dw_acc[v * 8 + i];
}

// The same with one warp per row (the block-per-row form above leaves half its threads idle at dim 1024 and
// waits on a block barrier per row): lane l owns the 16-byte vectors l, l + 32, ... (VPL of them), keeps
// their dw sums in registers, and the block sums its warps' in a fixed order at the end.
template <int VPL>
__global__ void __launch_bounds__(kThreads) rmsnorm_bwd_warp(const bf16* dy, const bf16* s, const float* w,
                                                             const float* rstd, bf16* dres, bool accumulate,
                                                             float* partial, int rows, int dim, Fp8Slot* amax) {
  __shared__ float red[kThreads / 32][32 * 8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, vecs = dim / 8;
  float dw[VPL][8] = {};
  float m = 0.0f;  // max |dres| written (amax)
  for (int row = blockIdx.x * (kThreads / 32) + warp; row < rows; row += gridDim.x * (kThreads / 32)) {
    const float r = rstd[row];
    const auto* dyr = reinterpret_cast<const Bf16x8*>(dy + static_cast<std::int64_t>(row) * dim);
    const auto* sr = reinterpret_cast<const Bf16x8*>(s + static_cast<std::int64_t>(row) * dim);
    Bf16x8 dp[VPL], xp[VPL];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int v = lane + 32 * k;
      if (v < vecs) {
        dp[k] = dyr[v], xp[k] = sr[v];
        float d[8], x[8];
        unpack8(dp[k], d);
        unpack8(xp[k], x);
        const float4 w0 = reinterpret_cast<const float4*>(w)[2 * v], w1 = reinterpret_cast<const float4*>(w)[2 * v + 1];
        const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        for (int i = 0; i < 8; ++i) dot += d[i] * wv[i] * x[i];
      }
    }
    dot = warp_sum(dot) * r / static_cast<float>(dim);
    auto* db = reinterpret_cast<Bf16x8*>(dres + static_cast<std::int64_t>(row) * dim);
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int v = lane + 32 * k;
      if (v < vecs) {
        float d[8], x[8], acc[8] = {};
        unpack8(dp[k], d);
        unpack8(xp[k], x);
        if (accumulate) unpack8(db[v], acc);
        const float4 w0 = reinterpret_cast<const float4*>(w)[2 * v], w1 = reinterpret_cast<const float4*>(w)[2 * v + 1];
        const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        for (int i = 0; i < 8; ++i) {
          const float xh = x[i] * r;
          acc[i] += r * (d[i] * wv[i] - xh * dot);
          dw[k][i] += d[i] * xh;
        }
        const Bf16x8 p = pack8(acc);
        db[v] = p;
        m = fmaxf(m, abs_max8(p));
      }
    }
  }
  if (amax) block_amax_commit(m, amax);
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    __syncthreads();
    for (int i = 0; i < 8; ++i) red[warp][lane * 8 + i] = dw[k][i];
    __syncthreads();
    const int col = k * 256 + threadIdx.x;  // kThreads == 256 columns per round
    float acc = 0.0f;
    for (int q = 0; q < kThreads / 32; ++q) acc += red[q][threadIdx.x];
    if (col < dim) partial[static_cast<std::int64_t>(blockIdx.x) * dim + col] = acc;
  }
}

// One 16-byte vector a thread and one row a block (blockDim = dim / 8, a multiple of 32): the thread keeps
// its 8 dw sums in registers across rows, so registers stay few (64 at dim 2048: 4 blocks a multiprocessor,
// where the warp-per-row form above holds VPL x 8 sums and the row in registers and fits 2). dres is loaded
// before the row's reduction so that the load is in flight during the barrier. It runs from dim 2048 up; below
// that its blocks are too small to keep the memory busy.
__global__ void __launch_bounds__(1024) rmsnorm_bwd_vec(const bf16* dy, const bf16* s, const float* w,
                                                        const float* rstd, bf16* dres, bool accumulate,
                                                        float* partial, int rows, int dim, Fp8Slot* amax) {
  __shared__ float scratch[32];
  const int v = threadIdx.x;
  const float4 w0 = reinterpret_cast<const float4*>(w)[2 * v], w1 = reinterpret_cast<const float4*>(w)[2 * v + 1];
  const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  float dw[8] = {}, m = 0.0f;  // m: max |dres| written (amax)
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t base = static_cast<std::int64_t>(row) * dim;
    const float r = rstd[row];
    float d[8], x[8];
    unpack8(reinterpret_cast<const Bf16x8*>(dy + base)[v], d);
    unpack8(reinterpret_cast<const Bf16x8*>(s + base)[v], x);
    Bf16x8* db = reinterpret_cast<Bf16x8*>(dres + base) + v;
    float acc[8] = {};
    if (accumulate) unpack8(*db, acc);
    float dot = 0.0f;
    for (int i = 0; i < 8; ++i) dot += d[i] * wv[i] * x[i];
    dot = block_sum(dot, scratch) * r / static_cast<float>(dim);
    for (int i = 0; i < 8; ++i) {
      const float xh = x[i] * r;
      acc[i] += r * (d[i] * wv[i] - xh * dot);
      dw[i] += d[i] * xh;
    }
    const Bf16x8 p = pack8(acc);
    *db = p;
    m = fmaxf(m, abs_max8(p));
  }
  if (amax) block_amax_commit(m, amax);
  float* out = partial + static_cast<std::int64_t>(blockIdx.x) * dim + 8 * v;
  reinterpret_cast<float4*>(out)[0] = make_float4(dw[0], dw[1], dw[2], dw[3]);
  reinterpret_cast<float4*>(out)[1] = make_float4(dw[4], dw[5], dw[6], dw[7]);
}

// R rows at a time, one 16-byte vector a thread (blockDim = dim / 8): every load of the R rows (dy, s and dres)
// is issued before the first reduction, and the R dot products share one block_sums barrier pair, so a
// block has R rows' bytes in flight where the form above has one row's, and waits on R times fewer barriers.
// The grid is as many blocks as fit the device at once (occupancy, not a table of H100 figures).
template <int R>
__global__ void __launch_bounds__(1024) rmsnorm_bwd_rows(const bf16* dy, const bf16* s, const float* w,
                                                         const float* rstd, bf16* dres, bool accumulate,
                                                         float* partial, int rows, int dim, Fp8Slot* amax) {
  __shared__ float scratch[R][32];
  const int v = threadIdx.x, lane = v & 31, warp = v >> 5, warps = blockDim.x >> 5;
  const float4 w0 = reinterpret_cast<const float4*>(w)[2 * v], w1 = reinterpret_cast<const float4*>(w)[2 * v + 1];
  const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  float dw[8] = {}, m = 0.0f;  // m: max |dres| written (amax)
  for (int first = blockIdx.x * R; first < rows; first += gridDim.x * R) {
    Bf16x8 dp[R], xp[R], ap[R];
    float r[R], dot[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int row = first + j < rows ? first + j : first;  // a row past the end repeats the first, unwritten
      const std::int64_t base = static_cast<std::int64_t>(row) * dim;
      dp[j] = reinterpret_cast<const Bf16x8*>(dy + base)[v];
      xp[j] = reinterpret_cast<const Bf16x8*>(s + base)[v];
      if (accumulate) ap[j] = reinterpret_cast<const Bf16x8*>(dres + base)[v];
      r[j] = rstd[row];
    }
#pragma unroll
    for (int j = 0; j < R; ++j) {
      float d[8], x[8];
      unpack8(dp[j], d);
      unpack8(xp[j], x);
      dot[j] = 0.0f;
      for (int i = 0; i < 8; ++i) dot[j] += d[i] * wv[i] * x[i];
      dot[j] = warp_sum(dot[j]);
    }
    __syncthreads();  // the previous rows' readers of scratch are done
    if (lane == 0)
      for (int j = 0; j < R; ++j) scratch[j][warp] = dot[j];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < R; ++j) {
      dot[j] = warp_sum(lane < warps ? scratch[j][lane] : 0.0f) * r[j] / static_cast<float>(dim);
      if (first + j >= rows) continue;
      float d[8], x[8], acc[8] = {};
      unpack8(dp[j], d);
      unpack8(xp[j], x);
      if (accumulate) unpack8(ap[j], acc);
      for (int i = 0; i < 8; ++i) {
        const float xh = x[i] * r[j];
        acc[i] += r[j] * (d[i] * wv[i] - xh * dot[j]);
        dw[i] += d[i] * xh;
      }
      const Bf16x8 p = pack8(acc);
      reinterpret_cast<Bf16x8*>(dres + static_cast<std::int64_t>(first + j) * dim)[v] = p;
      m = fmaxf(m, abs_max8(p));
    }
  }
  if (amax) block_amax_commit(m, amax);
  float* out = partial + static_cast<std::int64_t>(blockIdx.x) * dim + 8 * v;
  reinterpret_cast<float4*>(out)[0] = make_float4(dw[0], dw[1], dw[2], dw[3]);
  reinterpret_cast<float4*>(out)[1] = make_float4(dw[4], dw[5], dw[6], dw[7]);
}
constexpr int kRowsAtOnce = 2;

// The most blocks of rmsnorm_bwd_rows resident on this device at once for a dim (cached: ~60 launches a step).
int rows_form_blocks(int dim) {
  static thread_local int last_device = -1, last_dim = -1, last_blocks = 0;
  int device = 0, per_sm = 0;
  cudaGetDevice(&device);
  if (device == last_device && dim == last_dim) return last_blocks;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rmsnorm_bwd_rows<kRowsAtOnce>, dim / 8, 0);
  last_device = device, last_dim = dim, last_blocks = std::max(1, multiprocessors() * per_sm);
  return last_blocks;
}

// 4 a multiprocessor: 64 registers a thread at 256 threads (dim 2048) let 4 be resident, so every block is in
// the first wave (8 a multiprocessor made two waves and twice the partial rows).
int vec_blocks() { return 4 * multiprocessors(); }
// One 16-byte vector a thread fits a block: blockDim = dim / 8, a multiple of 32 and at most 1024.
bool one_vector_a_thread(int dim) { return dim % 256 == 0 && dim / 8 <= 1024; }
bool vec_form(int dim) { return one_vector_a_thread(dim) && dim >= 2048; }
// Below dim 2048 several rows a block keep enough bytes in flight; from 2048 the one-row vector form does as well.
bool rows_form(int dim) { return one_vector_a_thread(dim) && dim < 2048; }

int backward_blocks(int rows, int dim) {
  if (rows_form(dim)) return std::min((rows + kRowsAtOnce - 1) / kRowsAtOnce, rows_form_blocks(dim));
  const int most = vec_form(dim) ? vec_blocks() : max_blocks();
  return rows < most ? rows : most;
}

}  // namespace

void rmsnorm_forward(const bf16* x, const bf16* add, bf16* s_out, const float* w, bf16* y, float* rstd, int rows,
                     int dim, float eps, cudaStream_t stream, const Fp8Out* fp8) {
  const Fp8Out f8 = fp8 ? *fp8 : Fp8Out{};
  if (one_vector_a_thread(dim))
    return rmsnorm_fwd_vec<<<rows, dim / 8, 0, stream>>>(x, add, s_out, w, y, rstd, dim, eps, f8);
  rmsnorm_fwd<<<rows, kThreads, 0, stream>>>(x, add, s_out, w, y, rstd, dim, eps, f8);
}

std::int64_t rmsnorm_partial_floats(int rows, int dim) { return std::int64_t{backward_blocks(rows, dim)} * dim; }

void rmsnorm_backward(const bf16* dy, const bf16* s, const float* w, const float* rstd, bf16* dres, bool accumulate,
                      float* dw, float* partial, int rows, int dim, cudaStream_t stream, Fp8Slot* dres_amax) {
  const int blocks = backward_blocks(rows, dim);
  if (rows_form(dim)) {
    rmsnorm_bwd_rows<kRowsAtOnce><<<blocks, dim / 8, 0, stream>>>(dy, s, w, rstd, dres, accumulate, partial, rows, dim, dres_amax);
    sum_partial_rows(partial, blocks, dim, dw, dw, dim, stream);
    return;
  }
  if (vec_form(dim)) {
    rmsnorm_bwd_vec<<<blocks, dim / 8, 0, stream>>>(dy, s, w, rstd, dres, accumulate, partial, rows, dim, dres_amax);
    sum_partial_rows(partial, blocks, dim, dw, dw, dim, stream);
    return;
  }
  const int vpl = (dim / 8 + 31) / 32;
  if (dim % 8 == 0 && vpl <= 8) {
    static_assert(kThreads == 256, "the warp kernel's reduction rounds are 256 columns");
    if (vpl <= 1) rmsnorm_bwd_warp<1><<<blocks, kThreads, 0, stream>>>(dy, s, w, rstd, dres, accumulate, partial, rows, dim, dres_amax);
    else if (vpl <= 2) rmsnorm_bwd_warp<2><<<blocks, kThreads, 0, stream>>>(dy, s, w, rstd, dres, accumulate, partial, rows, dim, dres_amax);
    else if (vpl <= 4) rmsnorm_bwd_warp<4><<<blocks, kThreads, 0, stream>>>(dy, s, w, rstd, dres, accumulate, partial, rows, dim, dres_amax);
    else rmsnorm_bwd_warp<8><<<blocks, kThreads, 0, stream>>>(dy, s, w, rstd, dres, accumulate, partial, rows, dim, dres_amax);
    sum_partial_rows(partial, blocks, dim, dw, dw, dim, stream);
    return;
  }
  const auto smem = static_cast<std::size_t>(dim) * sizeof(float);
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(rmsnorm_bwd, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  rmsnorm_bwd<<<blocks, kThreads, smem, stream>>>(dy, s, w, rstd, dres, accumulate, partial, rows, dim, dres_amax);
  sum_partial_rows(partial, blocks, dim, dw, dw, dim, stream);
}

}  // namespace dlm::train::cuda
