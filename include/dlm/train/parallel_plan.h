// dlm-train --dry-run: each rank's memory (weights, gradients, optimizer state, activations) and the
// bytes it sends per step, for a model and a parallel layout, from the shapes alone: nothing is
// allocated, so a 1,000-GPU run is planned on a laptop. docs/parallelism.md derives every formula;
// the parameter counts are libckpt's sharding rules (rank_shards), the ones the trainer uses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/fp8.h"

namespace dlm::train {

struct PlanOptions {
  int tensor = 1, pipeline = 1, data = 1;
  int expert = 1;                       // --expert-model-parallel-size (divides data; MoE layers)
  bool sequence_parallel = false;       // --sequence-parallel
  bool distributed_optimizer = false;   // --use-distributed-optimizer
  std::int64_t micro_batch_size = 1, global_batch_size = 1, seq_length = 2048;
  bool bf16 = false;            // bf16 weights and activations, fp32 gradients and master weights; else all fp32
  bool recompute_full = false;  // --recompute-granularity full: each layer keeps only its input
  int virtual_stages = 1;       // model chunks per pipeline rank (--num-layers-per-virtual-pipeline-stage)
  // --device cuda: activations as the CUDA backend allocates them (cuda_memory_plan.h: its stored layers, work
  // buffers and logits chunk, plus the measured runtime), not Megatron's per-layer estimate; it keeps every
  // activation (no recomputation).
  bool cuda_backend = false;
  // --fp8-format with the CUDA backend: the FP8 layers' weight copies (in weights) and the casts' work buffers (in
  // activations), cuda_fp8_bytes.
  Fp8Options fp8;
};

// One pipeline stage (a pipeline rank: with virtual stages, its V chunks together); every rank of the
// stage (all its TP and DP ranks) holds the same amounts.
struct StagePlan {
  int stage = 0, first_layer = 0, layers = 0;  // first_layer: of the first chunk; layers: of all chunks
  int first_rank = 0, ranks = 0;        // global ranks [first_rank, first_rank + ranks)
  std::int64_t parameters = 0;          // elements held by one rank (its TP slice, replicas included)
  // The most micro-batches whose activations one chunk holds at once, from the schedule itself
  // (pipeline_schedule.h); with V chunks, per_chunk_in_flight has each chunk's.
  std::int64_t micro_batches_in_flight = 0;
  std::vector<std::int64_t> per_chunk_in_flight;
  double weights = 0, gradients = 0, optimizer = 0, activations = 0;  // bytes per rank
  double data_parallel_bytes = 0, tensor_parallel_bytes = 0, pipeline_bytes = 0;  // sent per rank per step
  std::int64_t expert_parameters = 0;   // of `parameters`: this rank's experts (E / EP of each MoE layer's)
  int moe_layers = 0;
  double expert_parallel_bytes = 0;     // all-to-all sends per rank per step (dispatch and combine, both passes)
  double memory() const { return weights + gradients + optimizer + activations; }
};

struct ParallelPlan {
  PlanOptions options;
  std::int64_t model_parameters = 0;          // the whole model's (padded vocabulary)
  std::int64_t micro_batches_per_rank = 0;    // G / (M * DP) per step
  std::vector<StagePlan> stages;
};

// dlm::Error naming the rule broken (TP not dividing the KV groups, a global batch that is not a
// multiple of micro-batch x DP...).
ParallelPlan plan_parallel(const ckpt::ModelConfig& config, const PlanOptions& options);
// The table dlm-train --dry-run prints.
std::string format_plan(const ckpt::ModelConfig& config, const ParallelPlan& plan);

}  // namespace dlm::train
