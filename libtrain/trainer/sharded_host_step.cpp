// The sharded host gradient step (gradient_step.h): Megatron's distributed optimizer (ZeRO-1) on CPU ranks.
// Each rank owns the contiguous d-th 1/DP of every GradBuffer bucket: its gradients are reduce-scattered
// there, it clips and updates only those pieces with its share of the AdamW moments, and the updated weights
// are all-gathered. The norm is the global one (each rank's share, summed over the group and the model).
#include <cmath>

#include "host_step.h"

namespace dlm::train {
namespace {

class ShardedHostStep final : public HostStep {
 public:
  ShardedHostStep(const TrainerOptions& options, TrainableModel& model, Communicator& data_parallel)
      : HostStep(options, model, &data_parallel, true) {
    sharded_ = true;
  }

  StepResult apply(double& loss, double lr) override {
    auto params = model_.parameters();
    sum_loss(loss);
    if (!overlapping()) buffer_->reduce_scatter_gradients(params, *dp_);
    auto shard = buffer_->shard_params(params);
    double sum_sq = squared_norm(shard);
    dp_->all_reduce(std::span<double>(&sum_sq, 1));
    const StepResult r = finish(loss, sum_sq, shard, lr);
    if (r.applied) buffer_->all_gather_weights(params, *dp_);
    return r;
  }

  // Collective: every rank contributes its pieces of the moments.
  void with_optimizer_state(const std::function<void(const AdamW&)>& use) override {
    use(buffer_->gather_optimizer(optimizer_, model_.parameters(), *dp_));
  }

  // Each rank's reduced range, summed over the group.
  std::int64_t zeros_in_gradients() override {
    double zeros = zeros_in(buffer_->shard_params(model_.parameters()));
    dp_->all_reduce(std::span<double>(&zeros, 1));
    model_.sum_over_model(std::span<double>(&zeros, 1));
    return static_cast<std::int64_t>(zeros);
  }

  // Each rank keeps its shard of the whole state.
  void load_optimizer_state(AdamW state) override {
    optimizer_ = buffer_->shard_optimizer(state, model_.parameters());
  }
};

}  // namespace

std::unique_ptr<GradientStep> make_sharded_host_step(const TrainerOptions& options, TrainableModel& model,
                                                     Communicator& data_parallel) {
  return std::make_unique<ShardedHostStep>(options, model, data_parallel);
}

}  // namespace dlm::train
