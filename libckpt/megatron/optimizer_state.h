// Megatron's Adam state (fp32 master weights, exp_avg, exp_avg_sq, step) mapped onto one rank's
// parameters (libckpt internal; the layouts are described in megatron.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
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

// torch_dist's dp_reshardable distributed-optimizer state (Megatron-LM's default with
// --use-distributed-optimizer): per model-parallel rank (dp_group_idx = tp_rank + TP * pp_rank) and bucket,
// one flat [numel_unpadded] tensor per slot in grad-buffer order, chunked at the saved pieces.
struct DpBucket {
  std::map<std::string, Tensor> slots;    // "param", "exp_avg", "exp_avg_sq"
  std::set<std::int64_t> chunk_starts;    // every parameter begins at one
};
using DpReshardableState = std::map<std::pair<int, int>, DpBucket>;  // (dp_group_idx, bucket_idx)
// optimizer.distributed.dp_group_idx_X.gbuf_idx_0.dtype_(...).bucket_idx_B.<slot> -> X, B, slot; false for
// any other key. A second grad buffer is refused.
bool dp_reshardable_key(const std::string& fqn, int& group, int& bucket, std::string& slot, const std::string& file);
// The per-rank parameters are rebuilt from the config in megatron-core's named_parameters order (local or
// Transformer Engine spec, whichever lays out to the saved bucket sizes and chunk starts; neither: refused),
// then merged across TP like the weights. Adds dlm's global tensors to the three sets.
void read_dp_reshardable(const DpReshardableState& state, const ModelConfig& config, const ParallelLayout& layout,
                         const PickleValue& args, const std::string& where, TensorSet& masters, TensorSet& exp_avg,
                         TensorSet& exp_avg_sq);
// The Adam step of the ShardedObject optimizer.distributed.dp_group_idx_0.optimizer ({param_groups}).
std::int64_t dp_reshardable_steps(const TorchFile& object);

// After loading: the moments cover exactly the model's tensors with their shapes (or are absent), the
// masters replace the saved (possibly bf16-rounded) weights. `masters` may be empty.
void adopt_optimizer_state(MegatronCheckpoint& m, TensorSet masters, const std::string& where);

}  // namespace dlm::ckpt::detail
