// Multi-tensor AdamW (torch.optim.AdamW's update, see optimizer.h) and the global gradient norm, each one
// launch over every parameter tensor: blockIdx.y picks the tensor, blocks stride over its elements.
//   clip = min(1, max_norm / (sqrt(sum g^2) + 1e-6))   (Megatron's rule; max_norm <= 0: 1), g <- clip * g
//   p <- p (1 - lr wd);  m <- m + (1 - b1)(g - m);  v <- b2 v + (1 - b2) g^2
//   p <- p - lr / (1 - b1^s) * m / (sqrt(v) / sqrt(1 - b2^s) + eps);  param_bf16 <- bf16(p)
// The norm's sum of squares is taken per block in double and summed over blocks in a fixed order, so it is
// the same number on every run; the clip factor is read on the device (no host round trip).
#include <cmath>

#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kNormBlocksPerTensor = 64;
constexpr int kMaxTensors = 4096;
constexpr int kStepBlocksPerTensor = 512;

__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ double block_sum_d(double v) {
  __shared__ double scratch[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.0;
  return warp_sum_d(v);
}

__global__ void __launch_bounds__(kThreads) sumsq_kernel(const AdamWTensor* tensors, double* partial) {
  const AdamWTensor t = tensors[blockIdx.y];
  double acc = 0.0;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < t.numel;
       i += static_cast<std::int64_t>(gridDim.x) * kThreads) {
    const double g = t.grad[i];
    acc += g * g;
  }
  acc = block_sum_d(acc);
  if (threadIdx.x == 0) partial[static_cast<std::int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = acc;
}

__global__ void __launch_bounds__(1024) sum_kernel(const double* partial, std::int64_t n, double* out) {
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum_d(acc);
  if (threadIdx.x == 0) *out = acc;
}

__global__ void __launch_bounds__(kThreads) adamw_kernel(const AdamWTensor* tensors, const double* sumsq,
                                                         double max_norm, float lr, float beta1, float beta2,
                                                         float eps, float step_size, float bc2_sqrt) {
  const AdamWTensor t = tensors[blockIdx.y];
  float clip = 1.0f;
  if (max_norm > 0 && sumsq) {
    const double c = max_norm / (sqrt(*sumsq) + 1e-6);
    if (c < 1.0) clip = static_cast<float>(c);
  }
  const float decay = 1.0f - lr * t.weight_decay;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < t.numel;
       i += static_cast<std::int64_t>(gridDim.x) * kThreads) {
    const float g = t.grad[i] * clip;
    float p = t.param[i] * decay;
    float m = t.m[i], v = t.v[i];
    m += (1.0f - beta1) * (g - m);
    v = beta2 * v + (1.0f - beta2) * g * g;
    p -= step_size * m / (sqrtf(v) / bc2_sqrt + eps);
    t.param[i] = p;
    t.m[i] = m;
    t.v[i] = v;
    if (t.param_bf16) t.param_bf16[i] = __float2bfloat16_rn(p);
  }
}

}  // namespace

int grad_norm_partial_doubles() { return kMaxTensors * kNormBlocksPerTensor; }

void grad_sumsq(const AdamWTensor* tensors_device, int count, double* partial, double* sumsq, cudaStream_t stream) {
  if (count > kMaxTensors) {
    check_cuda(cudaErrorInvalidValue, "grad_sumsq: more than 4096 parameter tensors");
  }
  sumsq_kernel<<<dim3(kNormBlocksPerTensor, count), kThreads, 0, stream>>>(tensors_device, partial);
  sum_kernel<<<1, 1024, 0, stream>>>(partial, std::int64_t{count} * kNormBlocksPerTensor, sumsq);
}

void adamw_step(const AdamWTensor* tensors_device, int count, const double* sumsq, double max_norm, float lr,
                float beta1, float beta2, float eps, int step, cudaStream_t stream) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), step);
  adamw_kernel<<<dim3(kStepBlocksPerTensor, count), kThreads, 0, stream>>>(
      tensors_device, sumsq, max_norm, lr, beta1, beta2, eps, static_cast<float>(lr / bc1),
      static_cast<float>(std::sqrt(bc2)));
}

}  // namespace dlm::train::cuda
