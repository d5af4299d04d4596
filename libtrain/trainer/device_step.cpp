// The device gradient step (gradient_step.h): clipping and AdamW run beside the weights on the GPU
// (DeviceTraining); only the gradient norm and the loss cross to the host each step.
#include <cmath>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "gradient_step.h"

namespace dlm::train {
namespace {

class DeviceStep final : public GradientStep {
 public:
  DeviceStep(const TrainerOptions& options, TrainableModel& model, DeviceTraining& device, Communicator* data_parallel,
             Communicator* device_data_parallel)
      : model_(model), device_(device), dp_(data_parallel), device_dp_(device_data_parallel), adam_(options.adam),
        clip_grad_(options.clip_grad) {
    const int dp = dp_ ? dp_->size() : 1;
    // The distributed optimizer on the GPU is the model's own (device.h): it must have been made for this
    // data-parallel group, and without the option it must not be sharded.
    const int shards = options.use_distributed_optimizer ? dp : 1;
    if (device_.optimizer_shards() != shards)
      fail(fmt::format("the GPU model's optimizer is split {} ways, and --use-distributed-optimizer over {} "
                       "data-parallel ranks needs {}",
                       device_.optimizer_shards(), dp, shards));
    if (dp <= 1) return;
    // The trainer's own all-reduce needs the device communicator; a model that reduces its gradients itself
    // (the distributed optimizer, the overlapped reduction) brings its group (NCCL, or staged for tests).
    if (device_dp_ ? device_dp_->size() != dp : !device_.reduces_gradients())
      fail("data parallelism of a model trained on the GPU needs NCCL (this build has none; or --device cpu)");
    // Megatron's DDP starts every replica from rank 0's weights: the fp32 master weights, then their bf16
    // copies. A distributed optimizer's rank holds only its range of the master weights, so rank 0 has none
    // of the others' to send; nor is there a need: the GPU model draws its init from counter streams keyed
    // by the global tensor (never the rank), so every replica starts from the same weights, and a checkpoint
    // loads the same values on every rank. (Without a device communicator, groups staged for tests, the
    // broadcast is left to that fact too; and under expert parallelism, whose data-parallel ranks hold other experts.)
    if (shards == 1 && device_dp_ && !model_.expert_parallel()) {
      for (const DeviceSpan& weights : device_.parameter_buffers())
        device_dp_->broadcast(std::span<float>(weights.data, static_cast<std::size_t>(weights.numel)), 0);
      device_.parameters_written();
    }
  }

  StepResult apply(double& loss, double lr) override {
    if (dp_ && dp_->size() > 1) {
      // The gradients summed over the replicas in device memory (one buffer per model chunk, NCCL; the
      // distributed optimizer's model has summed its range already, and a model overlapping the reduction
      // with its backward all of them); the loss on the host.
      if (!device_.reduces_gradients()) {
        for (const DeviceSpan& grads : device_.gradient_buffers())
          device_dp_->all_reduce(std::span<float>(grads.data, static_cast<std::size_t>(grads.numel)));
      }
      dp_->all_reduce(std::span<double>(&loss, 1));
    }
    StepResult r;
    r.grad_norm = device_.grad_norm();
    r.applied = std::isfinite(loss) && std::isfinite(r.grad_norm);
    if (r.applied) device_.step(adam_, lr, clip_grad_);
    else model_.zero_grad();
    return r;
  }

  // Collective under the model's distributed optimizer (it gathers the moments from every range).
  void with_optimizer_state(const std::function<void(const AdamW&)>& use) override { use(device_.optimizer_state()); }
  void with_checkpoint_state(const std::function<void(const AdamW&)>& use) override {
    AdamW steps(adam_);
    steps.set_steps(device_.optimizer_steps());
    use(steps);
  }
  void load_optimizer_state(AdamW state) override { device_.load_optimizer_state(state); }
  std::size_t overlapped_buckets() const override { return device_.buckets_reduced_in_backward(); }
  std::int64_t zeros_in_gradients() override { return device_.grad_zeros(); }

 private:
  TrainableModel& model_;
  DeviceTraining& device_;
  Communicator* dp_;
  Communicator* device_dp_;  // the data-parallel group over device memory
  AdamWOptions adam_;
  double clip_grad_;
};

}  // namespace

std::unique_ptr<GradientStep> make_device_step(const TrainerOptions& options, TrainableModel& model,
                                               DeviceTraining& device, Communicator* data_parallel,
                                               Communicator* device_data_parallel) {
  return std::make_unique<DeviceStep>(options, model, device, data_parallel, device_data_parallel);
}

}  // namespace dlm::train
