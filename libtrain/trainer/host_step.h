// The host arrangements' gradient step (gradient_step.h): AdamW on this process over host gradients, and with
// a data-parallel group the GradBuffer's buckets, reduced after the backward or, with --overlap-grad-reduce,
// during the last micro-batch's backward. ShardedHostStep (sharded_host_step.cpp) is this with the
// distributed optimizer's reduce-scatter, owned ranges and all-gather.
#pragma once

#include <memory>

#include "gradient_step.h"
#include "../parallel/grad_buffer.h"

namespace dlm::train {

class HostStep : public GradientStep {
 public:
  // With `buffered` (a data-parallel group of more than one rank, or the sharded optimizer) the gradients go
  // through a GradBuffer over `data_parallel`, and every replica starts from its rank 0's weights.
  HostStep(const TrainerOptions& options, TrainableModel& model, Communicator* data_parallel, bool buffered);

  void before_backward() override;
  void after_backward() override;
  StepResult apply(double& loss, double lr) override;
  void with_optimizer_state(const std::function<void(const AdamW&)>& use) override;
  void load_optimizer_state(AdamW state) override;
  std::size_t overlapped_buckets() const override;
  std::int64_t zeros_in_gradients() override;

 protected:
  // --overlap-grad-reduce over the buffer: the buckets were reduced during the backward.
  bool overlapping() const { return buffer_ && overlap_; }
  // The step's loss summed over the data-parallel group.
  void sum_loss(double& loss);
  // The global norm from this rank's squared sum: added over the model's other ranks (and, sharded, the group).
  StepResult finish(double loss, double sum_sq, std::span<const ParamRef> update, double lr);
  // Under expert parallelism the buffer holds the dense tensors and expert_buffer_ the experts' (over edp_);
  // otherwise dense_ is every parameter and experts_ is empty. Views of model_.parameters().
  std::vector<ParamRef> dense_params() const;
  std::vector<ParamRef> expert_params() const;
  // The squared norm this rank counts of dense tensors plus, summed over the expert-parallel group, of experts'.
  double split_squared_norm(std::span<const ParamRef> dense, std::span<const ParamRef> experts) const;

  TrainableModel& model_;
  Communicator* dp_;
  double clip_grad_;
  bool overlap_;
  bool sharded_;
  std::unique_ptr<GradBuffer> buffer_;
  std::vector<std::size_t> dense_, experts_;  // indices into model_.parameters()
  Communicator* edp_ = nullptr;               // the expert-data-parallel group (null: no expert parallelism)
  std::unique_ptr<GradBuffer> expert_buffer_;
  AdamW optimizer_;  // moments per parameter, or per owned piece when sharded
};

}  // namespace dlm::train
