// Device helpers shared by the kernels: warp/block reductions and bf16 vector access.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace dlm::train::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* scratch /*[32]*/) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

// Eight bf16 in one 16-byte access.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};
__device__ __forceinline__ void unpack8(const Bf16x8& p, float* f) {
  for (int i = 0; i < 4; ++i) {
    float2 t = __bfloat1622float2(p.h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ Bf16x8 pack8(const float* f) {
  Bf16x8 p;
  for (int i = 0; i < 4; ++i) p.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return p;
}

}  // namespace dlm::train::cuda
