// The expert dispatch's small kernels (moe_dispatch.cu; moe_dispatch.h says where they run).
#pragma once

#include "kernels.h"

namespace dlm::train::cuda {

// counts[e] = offsets[e + 1] - offsets[e], e < experts.
void moe_expert_counts(const int* offsets, int experts, int* counts, cudaStream_t stream);
// dst[i] = src[index[i]]  and  dst[index[i]] = src[i], i < n (fp32: the routing weights and their gradients).
void gather_f32(const float* src, const int* index, int n, float* dst, cudaStream_t stream);
void scatter_f32(const float* src, const int* index, int n, float* dst, cudaStream_t stream);

}  // namespace dlm::train::cuda
