// What the CUDA backend's CudaModel allocates for a training micro-batch shape, by its own rules
// (libtrain/backend/cuda/cuda_model_impl.h: ensure_acts, slot_acts, use_head, input_set), computed on any
// machine: the dry run plans GPU ranks with it (`dlm-train --dry-run --device cuda`). Bytes.
#pragma once

#include <cstdint>

#include "dlm/ckpt/model_config.h"

namespace dlm::train {

// The bf16 logits of one cross-entropy chunk: the backend never holds a whole micro-batch's logits.
constexpr std::int64_t kCudaLogitsBudget = std::int64_t{3} << 29;
// Measured beyond CudaModel's own buffers in a process's device memory (CUDA context, cuBLASLt's and
// cuDNN's workspaces, the RoPE tables): 0.66-0.73 GiB per process on an H100, CUDA 13, cuDNN 9.19
// (scripts/device-mem1.sh, 2026-11-23).
constexpr double kCudaRuntimeBytes = 0.72 * (1 << 30);
// NCCL's own device memory on a rank of a multi-GPU layout (its communicators' buffers and kernels), and what a
// pipeline group's point-to-point channels add: fitted to 2 x H200 runs of the 350M shape over NCCL, where measured
// minus planned was 1.33-1.34 GiB under DP2, 1.65 under TP2 + SP and 2.14-2.15 under PP2 (scripts/device-mp2.sh,
// 2026-11-24, docs/performance.md).
constexpr double kCudaNcclBytes = 1.35 * (1 << 30);
constexpr double kCudaNcclPipelineBytes = 0.8 * (1 << 30);

struct CudaActivationBytes {
  double per_layer_slot = 0;      // one layer's stored activations for one micro-batch in flight
  double shared = 0;              // the work buffers every micro-batch reuses (logits chunk included)
  double per_extra_head_slot = 0; // the last stage's head inputs per micro-batch in flight beyond the first
  double per_micro_batch_inputs = 0;  // one uploaded micro-batch's columns (a step uploads all of its own)
};

// For micro-batches of `tokens` tokens on a rank of tensor-parallel size `tensor` (the local widths: heads,
// KV groups, FFN and vocabulary rows divided by it; under sequence parallelism the residual stream's rows too),
// holding the embedding (`pre`) and/or the head (`post`). With `recompute` (full recomputation) a layer's slot
// is its input alone and one layer's other activations are shared.
CudaActivationBytes cuda_activation_bytes(const ckpt::ModelConfig& config, std::int64_t tokens, int tensor,
                                          bool sequence_parallel, bool pre, bool post, bool recompute = false);

}  // namespace dlm::train
