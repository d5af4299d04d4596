// Megatron-LM checkpoints, both formats, read into dlm's global tensors (model_config.h) and training state.
//
// The legacy format (--ckpt-format torch), one torch.save file per model-parallel rank:
//   ROOT/latest_checkpointed_iteration.txt   "42" or "release"
//   ROOT/iter_0000042/mp_rank_TT/model_optim_rng.pt          (PP = 1)
//   ROOT/iter_0000042/mp_rank_TT_PPP/model_optim_rng.pt      (PP > 1)
// each a dict {args: Namespace, checkpoint_version, iteration, model: state dict, optimizer, rng_state, ...}
// whose model holds the rank's local tensors with stage-local layer numbers. Merged along TP per tensor:
//   embedding.word_embeddings.weight, output_layer.weight    vocabulary rows (vocab-parallel), dim 0
//   self_attention.linear_qkv.weight                         dim 0: each rank holds whole query groups
//                                                            [q of the group's heads | k | v]
//   mlp.linear_fc1.weight (SwiGLU)                           each rank holds [gate_r ; up_r]; the global
//                                                            tensor is [gate_0 .. gate_T-1 ; up_0 .. up_T-1]
//   self_attention.linear_proj.weight, mlp.linear_fc2.weight dim 1 (row-parallel)
//   norms                                                    replicated; rank 0's copy
// Names of the local (non-Transformer-Engine) layer spec are mapped to TE's fused names, dlm's:
//   input_layernorm.weight -> self_attention.linear_qkv.layer_norm_weight,
//   pre_mlp_layernorm.weight -> mlp.linear_fc1.layer_norm_weight. `_extra_state` entries are skipped.
// The model config comes from args; models dlm does not have (biases, MoE, LayerNorm, no SwiGLU,
// learned positions) are refused with the argument that says so. Megatron pads the vocabulary to a
// multiple of make_vocab_size_divisible_by * TP; the dlm config takes that multiple so rows line up.
#pragma once

#include <string>

#include "dlm/ckpt/checkpoint.h"

namespace dlm::ckpt {

struct MegatronCheckpoint {
  ModelConfig config;
  TensorSet tensors;      // dlm's global fp32 tensors: the optimizer's fp32 masters where it saved them
  TensorSet exp_avg, exp_avg_sq;  // Adam's moments, global like the weights; empty without optimizer state
  TrainingState state;    // iteration, consumed samples (args.consumed_train_samples), optimizer steps, args_json
  ParallelLayout layout;  // the TP/PP it was saved with
};

// True when `path` is a Megatron legacy root (latest_checkpointed_iteration.txt) or iteration folder
// (mp_rank_* subfolders).
bool is_megatron_legacy(const std::string& path);
// Reads every rank file of the iteration `path` names (a root through latest_checkpointed_iteration.txt,
// or an iter_XXXXXXX / release folder).
MegatronCheckpoint load_megatron_legacy(const std::string& path);

// The torch_dist format (--ckpt-format torch_dist, megatron.core.dist_checkpointing), one folder per
// iteration written by every rank together:
//   ITER/common.pt        torch.save of the non-sharded state: args, iteration, checkpoint_version, ...
//   ITER/.metadata        torch.distributed.checkpoint Metadata (pickle): every global tensor's size and
//                         chunks, and for each chunk (file, offset, length)
//   ITER/__R_N.distcp     the chunks, each a torch.save archive of one tensor
// Global tensors are model space already: layers stacked along a leading dimension
// (decoder.layers.<name> is [num_layers, ...]), SwiGLU's fc1 [gate ; up] over all ranks, TE's norm
// names. `_extra_state` is skipped.
//
// Optimizer state, where saved (optimizer_state.cpp): the fp32 master weights, exp_avg, exp_avg_sq and
// the Adam step of megatron-core's Float16OptimizerWithFloat16Params / FP32Optimizer (the rank file's
// 'optimizer'), of its DistributedOptimizer (distrib_optim.pt beside the rank file; torch_dist's
// fully_reshardable optimizer.state.* and dp_reshardable buckets), merged across TP and PP exactly as the
// weights are.
bool is_megatron_torch_dist(const std::string& path);
MegatronCheckpoint load_megatron_torch_dist(const std::string& path);
// Either format, by what `path` holds.
MegatronCheckpoint load_megatron(const std::string& path);

}  // namespace dlm::ckpt
