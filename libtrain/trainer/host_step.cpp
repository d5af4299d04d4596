// The host gradient step (host_step.h): every rank updates every parameter after an all-reduce of the buckets.
#include "host_step.h"

#include <cmath>

namespace dlm::train {

HostStep::HostStep(const TrainerOptions& options, TrainableModel& model, Communicator* data_parallel, bool buffered)
    : model_(model), dp_(data_parallel), clip_grad_(options.clip_grad), overlap_(options.overlap_grad_reduce),
      sharded_(false), optimizer_(options.adam) {
  const auto params = model_.parameters();
  edp_ = model_.expert_data_parallel();
  for (std::size_t i = 0; i < params.size(); ++i) (edp_ && params[i].expert_parallel ? experts_ : dense_).push_back(i);
  if (!buffered || !dp_) return;
  // Megatron keeps the experts' gradients in buffers of their own (reduced over the expert-data-parallel group);
  // the overlapped reduction is not wired for two buffers, so they reduce after the backward.
  if (edp_) overlap_ = false;
  const auto dense = dense_params(), experts = expert_params();
  buffer_ = std::make_unique<GradBuffer>(dense, dp_->size(), dp_->rank(), options.ddp_bucket_size);
  if (edp_) expert_buffer_ = std::make_unique<GradBuffer>(experts, edp_->size(), edp_->rank(), options.ddp_bucket_size);
  // Megatron's DDP starts every replica from rank 0's weights, whatever each initialised.
  for (const auto& p : dense) dp_->broadcast(p.value, 0);
  for (const auto& p : experts) edp_->broadcast(p.value, 0);
}

std::vector<ParamRef> HostStep::dense_params() const {
  const auto all = model_.parameters();
  std::vector<ParamRef> out;
  for (std::size_t i : dense_) out.push_back(all[i]);
  return out;
}

std::vector<ParamRef> HostStep::expert_params() const {
  const auto all = model_.parameters();
  std::vector<ParamRef> out;
  for (std::size_t i : experts_) out.push_back(all[i]);
  return out;
}

double HostStep::split_squared_norm(std::span<const ParamRef> dense, std::span<const ParamRef> experts) const {
  double expert_sq = squared_norm(experts);
  if (Communicator* ep = model_.expert_parallel()) ep->all_reduce(std::span<double>(&expert_sq, 1));
  return squared_norm(dense) + expert_sq;
}

void HostStep::before_backward() {
  if (!overlapping()) return;
  // Each bucket's reduction starts as soon as the last micro-batch's backward has finished its gradients,
  // and runs while the rest of the backward computes.
  buffer_->begin_overlap(model_.parameters(), *dp_, sharded_);
  model_.set_gradient_ready_hook([this](std::size_t param) { buffer_->mark_ready(param); });
}

void HostStep::after_backward() {
  if (!overlapping()) return;
  model_.set_gradient_ready_hook({});
  buffer_->finish_overlap();
}

void HostStep::sum_loss(double& loss) {
  if (dp_ && dp_->size() > 1) dp_->all_reduce(std::span<double>(&loss, 1));
}

StepResult HostStep::finish(double loss, double sum_sq, std::span<const ParamRef> update, double lr) {
  model_.sum_over_model(std::span<double>(&sum_sq, 1));
  StepResult r;
  r.grad_norm = std::sqrt(sum_sq);
  r.applied = std::isfinite(loss) && std::isfinite(r.grad_norm);
  if (r.applied) {
    scale_gradients(update, clip_grad_, r.grad_norm);
    optimizer_.step(update, lr);
  } else {
    model_.zero_grad();
  }
  return r;
}

StepResult HostStep::apply(double& loss, double lr) {
  auto params = model_.parameters();
  sum_loss(loss);
  if (buffer_ && !overlapping()) buffer_->all_reduce_gradients(dense_params(), *dp_);
  if (expert_buffer_) expert_buffer_->all_reduce_gradients(expert_params(), *edp_);
  return finish(loss, split_squared_norm(dense_params(), expert_params()), params, lr);
}

void HostStep::with_optimizer_state(const std::function<void(const AdamW&)>& use) { use(optimizer_); }

void HostStep::load_optimizer_state(AdamW state) { optimizer_ = std::move(state); }

std::size_t HostStep::overlapped_buckets() const { return overlapping() ? buffer_->buckets_started_early() : 0; }

std::int64_t HostStep::zeros_in_gradients() {
  double expert_zeros = zeros_in(expert_params());
  if (Communicator* ep = model_.expert_parallel()) ep->all_reduce(std::span<double>(&expert_zeros, 1));
  double zeros = zeros_in(dense_params()) + expert_zeros;
  model_.sum_over_model(std::span<double>(&zeros, 1));
  return static_cast<std::int64_t>(zeros);
}

std::unique_ptr<GradientStep> make_host_step(const TrainerOptions& options, TrainableModel& model,
                                             Communicator* data_parallel) {
  const bool buffered = data_parallel && data_parallel->size() > 1;
  return std::make_unique<HostStep>(options, model, data_parallel, buffered);
}

}  // namespace dlm::train
