// The sharded host gradient step (gradient_step.h): Megatron's distributed optimizer (ZeRO-1) on CPU ranks.
// Each rank owns the contiguous d-th 1/DP of every GradBuffer bucket: its gradients are reduce-scattered
// there, it clips and updates only those pieces with its share of the AdamW moments, and the updated weights
// are all-gathered. The norm is the global one (each rank's share, summed over the group and the model).
#include <cmath>
#include <utility>

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
    const auto dense = dense_params(), experts = expert_params();
    sum_loss(loss);
    if (!overlapping()) buffer_->reduce_scatter_gradients(dense, *dp_);
    if (expert_buffer_) expert_buffer_->reduce_scatter_gradients(experts, *edp_);
    const auto dense_shard = buffer_->shard_params(dense), expert_shard = expert_shard_of(experts);
    // The dense range's squares over the data-parallel group; the experts' over their expert-data-parallel group
    // (then over the expert-parallel group, in split_squared_norm).
    double dense_sq = squared_norm(dense_shard), expert_sq = squared_norm(expert_shard);
    dp_->all_reduce(std::span<double>(&dense_sq, 1));
    if (edp_) edp_->all_reduce(std::span<double>(&expert_sq, 1));
    if (Communicator* ep = model_.expert_parallel()) ep->all_reduce(std::span<double>(&expert_sq, 1));
    auto shard = dense_shard;
    shard.insert(shard.end(), expert_shard.begin(), expert_shard.end());
    const StepResult r = finish(loss, dense_sq + expert_sq, shard, lr);
    if (r.applied) {
      buffer_->all_gather_weights(dense, *dp_);
      if (expert_buffer_) expert_buffer_->all_gather_weights(experts, *edp_);
    }
    return r;
  }

  // Collective: every rank contributes its pieces of the moments (the experts' over the expert-data-parallel group).
  void with_optimizer_state(const std::function<void(const AdamW&)>& use) override {
    const auto [dense, experts] = split_pieces(optimizer_);
    AdamW full = buffer_->gather_optimizer(dense, dense_params(), *dp_);
    if (expert_buffer_) {
      const AdamW gathered = expert_buffer_->gather_optimizer(experts, expert_params(), *edp_);
      full = merge(full, gathered);
    }
    use(full);
  }

  // Each rank's reduced range, summed over the group.
  std::int64_t zeros_in_gradients() override {
    double zeros = zeros_in(buffer_->shard_params(dense_params()));
    dp_->all_reduce(std::span<double>(&zeros, 1));
    double expert_zeros = zeros_in(expert_shard_of(expert_params()));
    if (edp_) edp_->all_reduce(std::span<double>(&expert_zeros, 1));
    if (Communicator* ep = model_.expert_parallel()) ep->all_reduce(std::span<double>(&expert_zeros, 1));
    zeros += expert_zeros;
    model_.sum_over_model(std::span<double>(&zeros, 1));
    return static_cast<std::int64_t>(zeros);
  }

  // Each rank keeps its shard of the whole state.
  void load_optimizer_state(AdamW state) override {
    if (!expert_buffer_) {
      optimizer_ = buffer_->shard_optimizer(state, model_.parameters());
      return;
    }
    const auto pick = [&](const std::vector<std::size_t>& which) {
      AdamW part(state.options());
      part.set_steps(state.steps());
      if (state.exp_avg().empty()) return part;
      for (std::size_t i : which) {
        part.exp_avg().push_back(state.exp_avg().at(i));
        part.exp_avg_sq().push_back(state.exp_avg_sq().at(i));
      }
      return part;
    };
    const AdamW dense = buffer_->shard_optimizer(pick(dense_), dense_params());
    const AdamW experts = expert_buffer_->shard_optimizer(pick(experts_), expert_params());
    optimizer_ = dense;
    for (std::size_t i = 0; i < experts.exp_avg().size(); ++i) {
      optimizer_.exp_avg().push_back(experts.exp_avg()[i]);
      optimizer_.exp_avg_sq().push_back(experts.exp_avg_sq()[i]);
    }
  }

 private:
  std::vector<ParamRef> expert_shard_of(std::span<const ParamRef> experts) const {
    return expert_buffer_ ? expert_buffer_->shard_params(experts) : std::vector<ParamRef>{};
  }
  // optimizer_'s pieces are the dense shard's, then the experts' (apply's order).
  std::pair<AdamW, AdamW> split_pieces(const AdamW& pieces) const {
    AdamW dense(pieces.options()), experts(pieces.options());
    dense.set_steps(pieces.steps());
    experts.set_steps(pieces.steps());
    const std::size_t n = pieces.exp_avg().empty() ? 0 : buffer_->shard_params(dense_params()).size();
    for (std::size_t i = 0; i < pieces.exp_avg().size(); ++i) {
      AdamW& to = i < n ? dense : experts;
      to.exp_avg().push_back(pieces.exp_avg()[i]);
      to.exp_avg_sq().push_back(pieces.exp_avg_sq()[i]);
    }
    return {std::move(dense), std::move(experts)};
  }
  // Per-parameter moments of the dense and expert tensors back in model order.
  AdamW merge(const AdamW& dense, const AdamW& experts) const {
    AdamW full(dense.options());
    full.set_steps(dense.steps());
    if (dense.exp_avg().empty() && experts.exp_avg().empty()) return full;
    const std::size_t n = dense_.size() + experts_.size();
    full.exp_avg().resize(n);
    full.exp_avg_sq().resize(n);
    for (std::size_t i = 0; i < dense_.size(); ++i) {
      full.exp_avg()[dense_[i]] = dense.exp_avg().at(i);
      full.exp_avg_sq()[dense_[i]] = dense.exp_avg_sq().at(i);
    }
    for (std::size_t i = 0; i < experts_.size(); ++i) {
      full.exp_avg()[experts_[i]] = experts.exp_avg().at(i);
      full.exp_avg_sq()[experts_[i]] = experts.exp_avg_sq().at(i);
    }
    return full;
  }
};

}  // namespace

std::unique_ptr<GradientStep> make_sharded_host_step(const TrainerOptions& options, TrainableModel& model,
                                                     Communicator& data_parallel) {
  return std::make_unique<ShardedHostStep>(options, model, data_parallel);
}

}  // namespace dlm::train
