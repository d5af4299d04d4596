// The one place the trainer's optimizer arrangement is chosen (gradient_step.h), and the host norm helpers.
#include "gradient_step.h"

namespace dlm::train {

std::unique_ptr<GradientStep> make_gradient_step(const TrainerOptions& options, TrainableModel& model,
                                                 Communicator* data_parallel, Communicator* device_data_parallel) {
  if (DeviceTraining* device = model.device_training())
    return make_device_step(options, model, *device, data_parallel, device_data_parallel);
  if (data_parallel && options.use_distributed_optimizer) return make_sharded_host_step(options, model, *data_parallel);
  return make_host_step(options, model, data_parallel);
}

double squared_norm(std::span<const ParamRef> params) {
  double sum_sq = 0;
  for (const auto& p : params)
    if (p.in_grad_norm)
      for (float g : p.grad) sum_sq += static_cast<double>(g) * g;
  return sum_sq;
}

double zeros_in(std::span<const ParamRef> params) {
  double zeros = 0;
  for (const auto& p : params)
    if (p.in_grad_norm)
      for (float g : p.grad) zeros += g == 0.0f ? 1 : 0;
  return zeros;
}

void scale_gradients(std::span<const ParamRef> params, double max_norm, double norm) {
  const double coeff = clip_coefficient(max_norm, norm);
  if (coeff >= 1.0) return;
  for (const auto& p : params)
    for (float& g : p.grad) g = static_cast<float>(g * coeff);
}

}  // namespace dlm::train
