// MegaDLMs' difflm-noshift noising on the device, drawn from the same counter-based stream as the host
// objective (philox.h: Philox4x32-10, counter {index lo, index hi, position, domain}, key = seed), so a
// micro-batch noised here is bit-identical to make_model_batch's:
//   t = U(1, sample, 0);  masked_j = U(2, sample, j) < t;  none masked: j = floor(U(3, sample, 0) * n)
//   weight_j = loss_mask_j * n / count / mask_sum where masked (mask_sum over the whole micro-batch)
// U is numpy's 53-bit double from two 32-bit words.
#include "common.cuh"
#include "kernels.h"
#include "philox.cuh"

namespace dlm::train::cuda {
namespace {

__global__ void noise_kernel(const int* clean, const float* loss_mask, const std::uint64_t* sample_index, int n,
                             std::uint64_t seed, int mask_token, double mask_sum, int* input_ids, float* weights,
                             std::uint8_t* masked) {
  __shared__ float scratch[32];
  __shared__ int forced;
  const int b = blockIdx.x;
  const std::uint64_t sample = sample_index[b];
  const double t = philox_uniform(seed, 1, sample, 0);
  const std::int64_t base = static_cast<std::int64_t>(b) * n;
  float count = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const bool m = philox_uniform(seed, 2, sample, static_cast<std::uint32_t>(j)) < t;
    masked[base + j] = m;
    count += m ? 1.0f : 0.0f;
  }
  count = block_sum(count, scratch);
  if (threadIdx.x == 0) {
    forced = -1;
    if (count == 0.0f) {
      const auto j = static_cast<std::int64_t>(philox_uniform(seed, 3, sample, 0) * static_cast<double>(n));
      forced = static_cast<int>(j < n - 1 ? j : n - 1);
      masked[base + forced] = 1;
    }
  }
  __syncthreads();
  const double total = count == 0.0f ? 1.0 : static_cast<double>(count);
  const double scale = mask_sum > 0 ? static_cast<double>(n) / total / mask_sum : 0.0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const bool m = masked[base + j] != 0;
    input_ids[base + j] = m ? mask_token : clean[base + j];
    weights[base + j] = m ? static_cast<float>(loss_mask[base + j] * scale) : 0.0f;
  }
}

}  // namespace

void diffusion_noise(const int* clean, const float* loss_mask, const std::uint64_t* sample_index, int batch, int n,
                     std::uint64_t seed, int mask_token, double mask_sum, int* input_ids, float* weights,
                     std::uint8_t* masked, cudaStream_t stream) {
  noise_kernel<<<batch, 256, 0, stream>>>(clean, loss_mask, sample_index, n, seed, mask_token, mask_sum, input_ids,
                                          weights, masked);
}

}  // namespace dlm::train::cuda
