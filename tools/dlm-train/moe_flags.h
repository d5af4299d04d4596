// Megatron's mixture-of-experts flags (docs/moe.md): the model's experts, router and router losses. Dropless routing
// on one expert-parallel rank is what dlm has; the flags that ask for more are refused naming what dlm offers.
#pragma once

#include <string>

#include <boost/program_options.hpp>

#include "dlm/ckpt/model_config.h"

namespace dlm::tools {

// The flags' words before they are checked.
struct MoeFlags {
  int num_experts = 0, topk = 2, ffn_hidden_size = 0, expert_parallel = 1, shared_expert_size = 0;
  int expert_tensor_parallel = 0;  // --expert-tensor-parallel-size; 0: not given (the TP size, megatron-core's default)
  std::string layer_freq = "1", score_function = "softmax", load_balancing = "aux_loss", dispatcher = "alltoall";
  double aux_loss_coeff = 0, z_loss_coeff = 0, capacity_factor = 0;
  std::string drop_policy = "probs";
  bool pre_softmax = false, grouped_gemm = false, pad_to_capacity = false, shared_expert_overlap = false;
};

void add_moe_flags(boost::program_options::options_description& group, MoeFlags& f);
// After notify: checks the words (a dlm::Error naming the flag) and sets the MoE fields of `model` when
// --num-experts > 0 (moe_ffn_hidden_size defaults to the model's ffn_hidden_size, as Megatron's).
void apply_moe_flags(const MoeFlags& f, const boost::program_options::variables_map& vm, ckpt::ModelConfig& model);
// --expert-tensor-parallel-size against --tensor-model-parallel-size: dlm splits each expert over the tensor group
// (megatron-core's default), so any other size is a dlm::Error naming both flags.
void check_expert_tensor_parallel(const MoeFlags& f, int tensor_parallel);

}  // namespace dlm::tools
