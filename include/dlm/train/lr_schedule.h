// Learning-rate schedule: megatron-core's OptimizerParamScheduler (optimizer_param_scheduler.py).
// Like Megatron, the formulas run on sample counts: the step after `iteration` iterations is
// iteration * global batch (the scheduler advances by the global batch each iteration), and the
// boundaries are in samples, given as iterations (times the global batch) or as samples directly
// (--lr-*-samples, --lr-warmup-fraction x decay: Megatron's float), so a boundary may fall inside an
// iteration and every value equals Megatron's to the last bit.
//
//   warmup (step <= warmup):  init + (max - init) * step / warmup
//   constant:                 max
//   step > decay_iters:       min
//   else, r = (step - warmup) / (decay_iters - warmup), lr = min + coeff * (max - min) with
//     linear 1 - r | cosine (cos(pi r) + 1) / 2 | inverse-square-root max * sqrt(warmup / step) (>= min)
//     WSD: 1 until decay_iters - wsd_decay_iters, then with w = (step - that) / wsd_decay_iters:
//          linear 1 - w | cosine (cos(pi w) + 1) / 2 | exponential 2 * 0.5^w - 1 | minus_sqrt 1 - sqrt(w)
//
// Megatron applies lr(k) to the update of iteration k + 1 (it steps the scheduler after the optimizer),
// so the first update of a warmed-up run uses init_lr (0 by default); dlm does the same.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dlm::train {

enum class LrDecayStyle { kConstant, kLinear, kCosine, kInverseSquareRoot, kWsd };
enum class WsdDecayStyle { kLinear, kCosine, kExponential, kMinusSqrt };

LrDecayStyle parse_lr_decay_style(const std::string& name);    // --lr-decay-style
WsdDecayStyle parse_wsd_decay_style(const std::string& name);  // --lr-wsd-decay-style

struct LrScheduleOptions {
  double max_lr = 1e-4;              // --lr
  double min_lr = 0.0;               // --min-lr
  double init_lr = 0.0;              // --lr-warmup-init
  std::int64_t warmup_iters = 0;     // --lr-warmup-iters
  std::int64_t decay_iters = 0;      // --lr-decay-iters (defaults to --train-iters)
  LrDecayStyle style = LrDecayStyle::kLinear;
  std::int64_t wsd_decay_iters = 0;  // --lr-wsd-decay-iters
  WsdDecayStyle wsd_style = WsdDecayStyle::kExponential;
  std::int64_t global_batch_size = 1;  // --global-batch-size: samples per iteration
  // The boundaries in samples; each replaces its iteration field times global_batch_size when set.
  std::optional<double> warmup_samples{};           // --lr-warmup-samples, or --lr-warmup-fraction x decay
  std::optional<std::int64_t> decay_samples{};      // --lr-decay-samples (default --train-samples)
  std::optional<std::int64_t> wsd_decay_samples{};  // --lr-wsd-decay-samples
};

class LrSchedule {
 public:
  // Throws dlm::Error naming the flag when the options are inconsistent (min > max, warmup >= decay...).
  explicit LrSchedule(LrScheduleOptions options);
  // The learning rate after `iteration` completed iterations.
  double at(std::int64_t iteration) const;
  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
  double warmup_ = 0;  // samples (Megatron's lr_warmup_steps; fractional from --lr-warmup-fraction)
  std::int64_t decay_ = 0, wsd_decay_ = 0;  // samples
};

}  // namespace dlm::train
