#include "dlm/train/lr_schedule.h"

#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train {

LrDecayStyle parse_lr_decay_style(const std::string& name) {
  if (name == "constant") return LrDecayStyle::kConstant;
  if (name == "linear") return LrDecayStyle::kLinear;
  if (name == "cosine") return LrDecayStyle::kCosine;
  if (name == "inverse-square-root") return LrDecayStyle::kInverseSquareRoot;
  if (name == "WSD") return LrDecayStyle::kWsd;
  fail(fmt::format("--lr-decay-style: '{}' is not one of constant, linear, cosine, inverse-square-root, WSD", name));
}

WsdDecayStyle parse_wsd_decay_style(const std::string& name) {
  if (name == "linear") return WsdDecayStyle::kLinear;
  if (name == "cosine") return WsdDecayStyle::kCosine;
  if (name == "exponential") return WsdDecayStyle::kExponential;
  if (name == "minus_sqrt") return WsdDecayStyle::kMinusSqrt;
  fail(fmt::format("--lr-wsd-decay-style: '{}' is not one of linear, cosine, exponential, minus_sqrt", name));
}

LrSchedule::LrSchedule(LrScheduleOptions o) : options_(o) {
  if (o.min_lr < 0) fail(fmt::format("--min-lr: {} is negative", o.min_lr));
  if (o.max_lr < o.min_lr) fail(fmt::format("--lr {} is below --min-lr {}", o.max_lr, o.min_lr));
  if (o.init_lr > o.max_lr) fail(fmt::format("--lr-warmup-init {} is above --lr {}", o.init_lr, o.max_lr));
  if (o.decay_iters <= 0) fail(fmt::format("--lr-decay-iters: {} must be positive", o.decay_iters));
  if (o.warmup_iters < 0 || o.warmup_iters >= o.decay_iters)
    fail(fmt::format("--lr-warmup-iters {} must be below --lr-decay-iters {}", o.warmup_iters, o.decay_iters));
  if (o.global_batch_size <= 0) fail(fmt::format("--global-batch-size: {} must be positive", o.global_batch_size));
  if (o.style == LrDecayStyle::kWsd && (o.wsd_decay_iters <= 0 || o.wsd_decay_iters > o.decay_iters))
    fail(fmt::format("--lr-wsd-decay-iters: {} must be in [1, {}] with --lr-decay-style WSD", o.wsd_decay_iters,
                     o.decay_iters));
}

double LrSchedule::at(std::int64_t iteration) const {
  // Megatron's units: samples.
  const std::int64_t g = options_.global_batch_size;
  LrScheduleOptions o = options_;
  o.warmup_iters *= g;
  o.decay_iters *= g;
  o.wsd_decay_iters *= g;
  const std::int64_t step = iteration * g;
  const double pi = std::numbers::pi;
  if (o.warmup_iters > 0 && step <= o.warmup_iters)
    return o.init_lr + (o.max_lr - o.init_lr) * static_cast<double>(step) / static_cast<double>(o.warmup_iters);
  if (o.style == LrDecayStyle::kConstant) return o.max_lr;
  if (step > o.decay_iters) return o.min_lr;
  if (o.style == LrDecayStyle::kInverseSquareRoot) {
    double warmup = static_cast<double>(std::max<std::int64_t>(o.warmup_iters, 1));
    double s = static_cast<double>(std::max<std::int64_t>(step, 1));
    return std::max(o.min_lr, o.max_lr * std::sqrt(warmup) / std::sqrt(s));
  }
  const double ratio = static_cast<double>(step - o.warmup_iters) / static_cast<double>(o.decay_iters - o.warmup_iters);
  double coeff = 1.0;
  switch (o.style) {
    case LrDecayStyle::kLinear: coeff = 1.0 - ratio; break;
    case LrDecayStyle::kCosine: coeff = 0.5 * (std::cos(pi * ratio) + 1.0); break;
    case LrDecayStyle::kWsd: {
      const std::int64_t anneal_start = o.decay_iters - o.wsd_decay_iters;
      if (step <= anneal_start) break;
      const double w = static_cast<double>(step - anneal_start) / static_cast<double>(o.wsd_decay_iters);
      switch (o.wsd_style) {
        case WsdDecayStyle::kLinear: coeff = 1.0 - w; break;
        case WsdDecayStyle::kCosine: coeff = 0.5 * (std::cos(pi * w) + 1.0); break;
        case WsdDecayStyle::kExponential: coeff = 2.0 * std::pow(0.5, w) - 1.0; break;
        case WsdDecayStyle::kMinusSqrt: coeff = 1.0 - std::sqrt(w); break;
      }
      break;
    }
    default: break;
  }
  return o.min_lr + coeff * (o.max_lr - o.min_lr);
}

}  // namespace dlm::train
