// The gradient step: what happens to a step's gradients once the backward pass has run (summed over the
// data-parallel group, clipped by the global norm, applied by AdamW). One of three arrangements, chosen once
// when the Trainer is made (make_gradient_step) and then only called:
//   host (host_step.cpp): AdamW over every parameter on this process; under data parallelism the gradients
//     are all-reduced through the GradBuffer's buckets (during the last backward with --overlap-grad-reduce).
//   sharded host (sharded_host_step.cpp): --use-distributed-optimizer on CPU ranks, ZeRO-1 over the
//     GradBuffer: the gradients reduce-scattered, each rank clipping and updating the range it owns with its
//     share of the moments, the updated weights all-gathered.
//   device (device_step.cpp): a model trained on a GPU (DeviceTraining) clips and updates beside its weights;
//     the gradients are summed over the device communicator unless the model reduced them itself.
// Every arrangement gives the single-process run up to the order of fp32 sums (docs/parallelism.md).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>

#include "dlm/train/communicator.h"
#include "dlm/train/optimizer.h"
#include "dlm/train/trainer.h"

namespace dlm::train {

struct StepResult {
  double grad_norm = 0;  // the global L2 norm before clipping
  bool applied = false;  // the loss and the norm were finite and the update ran; else the gradients were dropped
};

class GradientStep {
 public:
  virtual ~GradientStep() = default;
  // Called around the step's backward pass (forward_backward_all, then finish_gradients): where the
  // overlapped reduction hooks into the model.
  virtual void before_backward() {}
  virtual void after_backward() {}
  // Sums `loss` (this rank's share) over the data-parallel group in place, completes the gradients'
  // reduction, takes the global norm and, when the loss and the norm are finite, clips and updates at `lr`;
  // otherwise it zeroes the gradients and leaves the weights as they were.
  virtual StepResult apply(double& loss, double lr) = 0;
  // Calls `use` with the whole optimizer state, moments per parameter in model order (collective over the
  // data-parallel group where the state is sharded: every rank must call it).
  virtual void with_optimizer_state(const std::function<void(const AdamW&)>& use) = 0;
  // What a SaveFn gets (trainer.h): the whole state, or on the device only its options and step count.
  virtual void with_checkpoint_state(const std::function<void(const AdamW&)>& use) { with_optimizer_state(use); }
  // A checkpoint's whole state; each arrangement keeps what it holds of it.
  virtual void load_optimizer_state(AdamW state) = 0;
  // Of the last step's gradient buckets, those whose reduction started before the backward pass ended.
  virtual std::size_t overlapped_buckets() const = 0;
  // --log-num-zeros-in-grad: the zeros in the last step's summed gradients over the whole model (Megatron's
  // count_zeros_fp32: replicas of other model-parallel ranks' tensors not counted); collective over the model and,
  // sharded, the data-parallel group. The device arrangement counts on the GPU (DeviceTraining::grad_zeros()).
  virtual std::int64_t zeros_in_gradients() = 0;
};

// The arrangement for `model` and the groups: device when the model has DeviceTraining, sharded host with
// --use-distributed-optimizer and a data-parallel group, else host. Checks that the model and the groups fit
// it (dlm::Error) and starts every replica from rank 0's weights.
std::unique_ptr<GradientStep> make_gradient_step(const TrainerOptions& options, TrainableModel& model,
                                                 Communicator* data_parallel, Communicator* device_data_parallel);

std::unique_ptr<GradientStep> make_host_step(const TrainerOptions& options, TrainableModel& model,
                                             Communicator* data_parallel);
std::unique_ptr<GradientStep> make_sharded_host_step(const TrainerOptions& options, TrainableModel& model,
                                                     Communicator& data_parallel);
std::unique_ptr<GradientStep> make_device_step(const TrainerOptions& options, TrainableModel& model,
                                               DeviceTraining& device, Communicator* data_parallel,
                                               Communicator* device_data_parallel);

// The squared L2 norm of the gradients this rank counts (replicas of other model-parallel ranks' tensors are
// not counted: Megatron's param_is_not_tensor_parallel_duplicate and shared-embedding rules).
double squared_norm(std::span<const ParamRef> params);
// The zero entries of the gradients this rank counts (the same rule as squared_norm).
double zeros_in(std::span<const ParamRef> params);
// Megatron's clipping (optimizer.h) by a global norm computed beforehand.
void scale_gradients(std::span<const ParamRef> params, double max_norm, double norm);

}  // namespace dlm::train
