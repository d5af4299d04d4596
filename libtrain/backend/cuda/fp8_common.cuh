// Device helpers of the FP8 casts (fp8_cast.cu and the producers that fuse a cast or an amax: rmsnorm.cu, swiglu.cu).
#pragma once

#include <cuda_fp8.h>

#include "common.cuh"
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
// *addr = max(*addr, v) for non-negative floats (their bit patterns order as integers); NaN is skipped.
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  if (v > 0.0f) atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
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
// A fused producer's cast of its eight outputs (Fp8Out): amax always, the cast with slot->scale when out is set.
// Returns the eight's largest |value| for the caller's block_amax_commit.
__device__ __forceinline__ float fused_fp8x8(const float* v, const Fp8Out& f, std::int64_t offset) {
  float m = 0.0f;
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
  if (f.out) store_fp8x8(v, f.slot->scale, f.e5m2, f.out + offset);
  return m;
}
// A fused producer's first thread records the inverse of the scale it cast with (delayed).
__device__ __forceinline__ void fused_fp8_scale_inv(const Fp8Out& f) {
  if (f.out && blockIdx.x == 0 && threadIdx.x == 0) f.slot->scale_inv = 1.0f / f.slot->scale;
}

}  // namespace dlm::train::cuda
