// AdamW as torch.optim.AdamW computes it (decoupled weight decay, bias correction), and Megatron's
// global-norm gradient clipping.
//
// One step at learning rate lr, step count s (1-based), per element:
//   p <- p * (1 - lr * wd)                      (wd = 0 for tensors flagged no_decay: RMSNorm weights)
//   m <- m + (1 - beta1) * (g - m)
//   v <- beta2 * v + (1 - beta2) * g^2
//   p <- p - lr / (1 - beta1^s) * m / (sqrt(v) / sqrt(1 - beta2^s) + eps)
// Clipping (megatron.core.optimizer.clip_grads): norm = sqrt(sum g^2) over every tensor; when
// clip / (norm + 1e-6) < 1, every gradient is scaled by it.
//
// The optimizer works on host fp32 spans: the CPU backend hands its buffers over directly; a device
// backend runs the same update in its own kernel and is tested against this one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dlm::train {

struct AdamWOptions {
  double beta1 = 0.9;          // --adam-beta1
  double beta2 = 0.999;        // --adam-beta2
  double eps = 1e-8;           // --adam-eps
  double weight_decay = 0.01;  // --weight-decay
};

// One parameter tensor as the optimizer sees it.
struct ParamRef {
  std::string name;
  std::span<float> value;
  std::span<float> grad;  // mutable: clipping scales it in place
  bool decay = true;  // false for norms (TensorSpec::is_norm)
  std::vector<std::int64_t> shape;  // the global shape, for checkpoints ({numel} when empty)
  // Counted in the global gradient norm (false for a replica another model-parallel rank counts).
  bool in_grad_norm = true;
  // An expert's tensor under expert parallelism: its gradient is summed over the expert-data-parallel group (not
  // the data-parallel one), its share of the norm over the expert-parallel group (TrainableModel's groups).
  bool expert_parallel = false;
};

class AdamW {
 public:
  explicit AdamW(AdamWOptions options) : options_(options) {}

  // Applies one update at `lr`; allocates the moments on the first call (in the order of `params`).
  void step(std::span<const ParamRef> params, double lr);

  std::int64_t steps() const { return steps_; }
  const AdamWOptions& options() const { return options_; }
  // Moments, for checkpoints: one vector per parameter tensor, in the order of `params`.
  std::vector<std::vector<float>>& exp_avg() { return m_; }
  std::vector<std::vector<float>>& exp_avg_sq() { return v_; }
  const std::vector<std::vector<float>>& exp_avg() const { return m_; }
  const std::vector<std::vector<float>>& exp_avg_sq() const { return v_; }
  void set_steps(std::int64_t steps) { steps_ = steps; }

 private:
  AdamWOptions options_;
  std::int64_t steps_ = 0;
  std::vector<std::vector<float>> m_, v_;
};

// Megatron's clipping factor for a global gradient norm: max_norm / (norm + 1e-6) when that is below 1,
// else 1 (no clipping; also for max_norm <= 0). Model parallelism computes the norm from its parts first.
double clip_coefficient(double max_norm, double norm);
// The global L2 norm of all gradients (double accumulation).
double global_grad_norm(std::span<const std::span<const float>> grads);
// Scales the gradients so that their global norm is at most `max_norm` (Megatron's rule, above);
// returns the norm before clipping. max_norm <= 0 disables clipping.
double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm);

}  // namespace dlm::train
