// The host gradient step (host_step.h): every rank updates every parameter after an all-reduce of the buckets.
#include "host_step.h"

#include <cmath>

namespace dlm::train {

HostStep::HostStep(const TrainerOptions& options, TrainableModel& model, Communicator* data_parallel, bool buffered)
    : model_(model), dp_(data_parallel), clip_grad_(options.clip_grad), overlap_(options.overlap_grad_reduce),
      sharded_(false), optimizer_(options.adam) {
  if (!buffered || !dp_) return;
  const auto params = model_.parameters();
  buffer_ = std::make_unique<GradBuffer>(params, dp_->size(), dp_->rank(), options.ddp_bucket_size);
  // Megatron's DDP starts every replica from rank 0's weights, whatever each initialised.
  for (const auto& p : params) dp_->broadcast(p.value, 0);
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
  if (buffer_ && !overlapping()) buffer_->all_reduce_gradients(params, *dp_);
  return finish(loss, squared_norm(params), params, lr);
}

void HostStep::with_optimizer_state(const std::function<void(const AdamW&)>& use) { use(optimizer_); }

void HostStep::load_optimizer_state(AdamW state) { optimizer_ = std::move(state); }

std::size_t HostStep::overlapped_buckets() const { return overlapping() ? buffer_->buckets_started_early() : 0; }

std::int64_t HostStep::zeros_in_gradients() {
  double zeros = zeros_in(model_.parameters());
  model_.sum_over_model(std::span<double>(&zeros, 1));
  return static_cast<std::int64_t>(zeros);
}

std::unique_ptr<GradientStep> make_host_step(const TrainerOptions& options, TrainableModel& model,
                                             Communicator* data_parallel) {
  const bool buffered = data_parallel && data_parallel->size() > 1;
  return std::make_unique<HostStep>(options, model, data_parallel, buffered);
}

}  // namespace dlm::train
