// dlm's global tensors -> a Megatron torch_dist checkpoint (--ckpt-format torch_dist) that megatron-core's
// dist_checkpointing.load and megatron/training's load_checkpoint open:
//   ROOT/latest_checkpointed_iteration.txt   "42"
//   ROOT/iter_0000042/metadata.json          {"sharded_backend": "torch_dist", ...} (megatron's CheckpointingConfig)
//   ROOT/iter_0000042/common.pt              torch.save of {args: Namespace, iteration, checkpoint_version 3.0}
//   ROOT/iter_0000042/.metadata              torch.distributed.checkpoint Metadata (pickle)
//   ROOT/iter_0000042/__0_0.distcp           every chunk, each a torch.save archive of one fp32 tensor
// The tensors are written in megatron-core's sharded (model-space) form, which no TP/PP layout changes:
// decoder.layers.<name> stacked as [num_layers, ...] with one chunk per layer, SwiGLU's fc1 as
// [gate ; up], TE's norm names, and each linear layer's `_extra_state` object (None), which
// megatron-core's layers ask for. Any TP/PP that divides the model loads it; `tp` and `pp` only go into
// args and choose the vocabulary padding (Megatron pads to make_vocab_size_divisible_by * TP; rows are
// added as zeros when dlm's padding is not a multiple of that, never dropped).
// The iteration is written as iter_XXXXXXX.tmp, each file fsynced, renamed, then the tracker replaced
// atomically; an existing iteration folder is refused. No optimizer or RNG state is written.
#pragma once

#include <string>

#include "dlm/ckpt/checkpoint.h"

namespace dlm::ckpt {

struct MegatronExportOptions {
  int tp = 1;  // --target-tensor-parallel-size: args.tensor_model_parallel_size and the vocabulary padding
  int pp = 1;  // --target-pipeline-parallel-size: args.pipeline_model_parallel_size
};

// Returns the iteration folder written.
std::string save_megatron_torch_dist(const std::string& root, const ModelConfig& config, const TensorSet& tensors,
                                     const TrainingState& state, const MegatronExportOptions& options);

}  // namespace dlm::ckpt
