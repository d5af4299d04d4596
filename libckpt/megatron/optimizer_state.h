// Megatron's Adam state (fp32 master weights, exp_avg, exp_avg_sq, step) mapped onto one rank's
// parameters (libckpt internal; the layouts are described in megatron.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlm/ckpt/megatron.h"
#include "dlm/ckpt/torch_file.h"

namespace dlm::ckpt::detail {

// One parameter of a rank, in the order of the rank's model state dict (megatron's named_parameters
// order, which both the optimizer's param groups and the distributed optimizer's buffer follow).
struct LocalParam {
  std::string local;  // the state-dict name, e.g. decoder.layers.0.mlp.linear_fc1.weight
  std::vector<std::int64_t> shape;
  bool shared_embedding = false;  // a tied embedding or its last-stage copy: its own buffer bucket
};

// Per parameter (same order as the LocalParam list): fp32 master, exp_avg, exp_avg_sq.
struct LocalOptimizerState {
  std::vector<Tensor> master, exp_avg, exp_avg_sq;
  std::int64_t steps = 0;
};

// The optimizer state of a legacy rank file (its 'optimizer' entry, and distrib_optim.pt beside it for
// the distributed optimizer), or nothing when the file has none. Anything that cannot be mapped onto
// `params` is a one-line dlm::Error naming the file and key.
std::optional<LocalOptimizerState> read_legacy_optimizer_state(const TorchFile& rank_file, const std::vector<LocalParam>& params,
                                                               const PickleValue& args);

// torch_dist: which optimizer tensor a sharded-state key holds, and the model key it belongs to:
// optimizer.state.{fp32_param|param|exp_avg|exp_avg_sq}.<model key>. Returns "" (and leaves `model_key`)
// for any other key.
std::string torch_dist_optimizer_slot(const std::string& fqn, std::string& model_key);
// The Adam step of a torch_dist checkpoint from common.pt's 'optimizer' (non-distributed:
// optimizer.state.common_step; distributed: optimizer.param_groups[*].step); -1 when absent.
std::int64_t torch_dist_optimizer_steps(const TorchFile& common);

// After loading: the moments cover exactly the model's tensors with their shapes (or are absent), the
// masters replace the saved (possibly bf16-rounded) weights. `masters` may be empty.
void adopt_optimizer_state(MegatronCheckpoint& m, TensorSet masters, const std::string& where);

}  // namespace dlm::ckpt::detail
