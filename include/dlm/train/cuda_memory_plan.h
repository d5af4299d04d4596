// What the CUDA backend's CudaModel allocates for a training micro-batch shape, computed on any machine: the
// activation layout (every buffer's element count) that CudaModel allocates from, and the bytes the dry run plans
// GPU ranks with (`dlm-train --dry-run --device cuda`), summed from the same layout.
#pragma once

#include <cstdint>

#include "dlm/ckpt/model_config.h"

namespace dlm::train {

// The bf16 logits of one cross-entropy chunk: the backend never holds a whole micro-batch's logits.
constexpr std::int64_t kCudaLogitsBudget = std::int64_t{3} << 29;
// A process's device memory beyond CudaModel's own buffers (CUDA context, cuBLASLt's and cuDNN's workspaces, the
// RoPE tables), fitted to measured one-GPU peaks (scripts/device-mem1.sh; DryRun.GpuPlanFollowsTheMeasuredPeaks).
constexpr double kCudaRuntimeBytes = 0.72 * (1 << 30);
// NCCL's own device memory on a rank of a multi-GPU layout (its communicators' buffers and kernels), and what a
// pipeline group's point-to-point channels add: fitted to two-GPU peaks of the 350M shape under DP2, TP2 + SP and
// PP2 (scripts/device-mp2.sh; DryRun.GpuPlanFollowsTheMeasuredPeaks).
constexpr double kCudaNcclBytes = 1.35 * (1 << 30);
constexpr double kCudaNcclPipelineBytes = 0.8 * (1 << 30);

// The embedding backward's plan (backend/cuda/embedding.cu) for `tokens` tokens cuts each id's run into segments
// of at most kCudaEmbeddingSegment tokens: at most cuda_embedding_segments(tokens) segments, and
// cuda_embedding_slots(tokens) partial rows (and combine entries) for the ids of several segments.
constexpr int kCudaEmbeddingSegment = 32;
constexpr std::int64_t cuda_embedding_segments(std::int64_t tokens) {
  return tokens + tokens / kCudaEmbeddingSegment + 2;
}
constexpr std::int64_t cuda_embedding_slots(std::int64_t tokens) { return 2 * (tokens / kCudaEmbeddingSegment) + 2; }

// Element counts of every buffer CudaModel allocates per micro-batch shape (names as in the backend's
// ActivationBuffers, libtrain/backend/cuda/activations.h). T is the micro-batch's tokens, Ts the rank's rows of the
// residual stream (T / TP under sequence parallelism, else T); widths are the rank's (heads, groups, FFN and
// vocabulary rows divided by the tensor-parallel size). 0: not allocated (the buffer is another's, or the rank
// needs none). The backend's work buffers whose size depends on the device (the norms' partial sums) and the
// one-double loss total are not counted.
struct CudaLayerActsLayout {  // one layer's stored activations for one micro-batch in flight
  std::int64_t res1 = 0, h1 = 0, qkv_raw = 0, qkv_rot = 0, att = 0, res2 = 0, h2 = 0, gu = 0, act = 0;  // bf16
  std::int64_t rstd1 = 0, qk_rstd = 0, lse = 0, rstd2 = 0;                                            // fp32
  std::int64_t input_bytes() const { return res1 * 2; }
  // Everything but the input: what full recomputation shares over the layers.
  std::int64_t rest_bytes() const {
    return (h1 + qkv_raw + qkv_rot + att + res2 + h2 + gu + act) * 2 + (rstd1 + qk_rstd + lse + rstd2) * 4;
  }
};
struct CudaSharedActsLayout {  // the work buffers every micro-batch reuses
  std::int64_t tmp = 0, res_f = 0, dres16 = 0, dh = 0, hf = 0, logits = 0, dact = 0;  // bf16
  std::int64_t tmp_full = 0, hloc = 0, dres16_full = 0, dh_full = 0;                   // bf16, sequence parallel
  std::int64_t stage_out = 0;                                                          // bf16, before the last stage
  std::int64_t dgu = 0, datt = 0, dqkv_rot = 0, dqkv = 0, head_x = 0;                  // bf16
  std::int64_t dres_in = 0, rstd_f = 0, dres = 0, delta = 0, dres_full = 0;            // fp32
  std::int64_t ce_lse = 0, ce_label = 0, emb_partial = 0;                              // fp32
  std::int64_t bytes() const {
    return (tmp + res_f + dres16 + dh + hf + logits + dact + tmp_full + hloc + dres16_full + dh_full + stage_out +
            dgu + datt + dqkv_rot + dqkv + head_x) * 2 +
           (dres_in + rstd_f + dres + delta + dres_full + ce_lse + ce_label + emb_partial) * 4;
  }
};
struct CudaHeadSlotLayout {  // the last stage's head inputs of one further micro-batch in flight
  std::int64_t res_f = 0, hf = 0;  // bf16
  std::int64_t rstd_f = 0;         // fp32
  std::int64_t bytes() const { return (res_f + hf) * 2 + rstd_f * 4; }
};
struct CudaInputsLayout {  // one uploaded micro-batch's columns
  std::int64_t columns = 0;   // each of ids, labels, positions, order, head rows, head slots (int), weights, losses
  std::int64_t segments = 0;  // the embedding plan's segments (4 ints each) and combine entries (3 ints each)
  std::int64_t combine = 0;
  std::int64_t bytes() const { return columns * 8 * 4 + segments * 16 + combine * 12; }
};
struct CudaActivationLayout {
  std::int64_t tokens = 0, rows = 0;  // T and Ts
  std::int64_t chunk = 0;             // the logits' rows per cross-entropy chunk (kCudaLogitsBudget)
  CudaLayerActsLayout layer;          // with recompute, every buffer but res1 is one layer's, shared
  CudaSharedActsLayout shared;
  CudaHeadSlotLayout head;            // zeros without the head
  CudaInputsLayout inputs;
};

// For micro-batches of `tokens` tokens on a rank of tensor-parallel size `tensor`, holding the embedding (`pre`)
// and/or the head (`post`).
CudaActivationLayout cuda_activation_layout(const ckpt::ModelConfig& config, std::int64_t tokens, int tensor,
                                            bool sequence_parallel, bool pre, bool post);

struct CudaActivationBytes {
  double per_layer_slot = 0;      // one layer's stored activations for one micro-batch in flight
  double shared = 0;              // the work buffers every micro-batch reuses (logits chunk included)
  double per_extra_head_slot = 0; // the last stage's head inputs per micro-batch in flight beyond the first
  double per_micro_batch_inputs = 0;  // one uploaded micro-batch's columns (a step uploads all of its own)
};

// cuda_activation_layout's bytes. With `recompute` (full recomputation) a layer's slot is its input alone and one
// layer's other activations are shared.
CudaActivationBytes cuda_activation_bytes(const ckpt::ModelConfig& config, std::int64_t tokens, int tensor,
                                          bool sequence_parallel, bool pre, bool post, bool recompute = false);

// FP8 linear layers (CudaOptions::fp8, libtrain/backend/cuda/fp8_linear.h) on a rank of tensor-parallel size
// `tensor`: one FP8 layer's four weights as FP8 copies plus their transposes (2 bytes a weight), and once per model
// with any FP8 layer the casts' work buffers for `tokens` rows (padded to 16, the transposed operands' rows): the
// input (x, or x^T in the backward) at the widest input width, dy and dy^T at the widest output width, 1 byte an
// element.
struct CudaFp8Bytes {
  double per_layer = 0, work = 0;
};
CudaFp8Bytes cuda_fp8_bytes(const ckpt::ModelConfig& config, std::int64_t tokens, int tensor);

}  // namespace dlm::train
