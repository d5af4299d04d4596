#include "dlm/train/lr_schedule.h"

#include <algorithm>
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
  if (o.global_batch_size <= 0) fail(fmt::format("--global-batch-size: {} must be positive", o.global_batch_size));
  const std::int64_t g = o.global_batch_size;
  decay_ = o.decay_samples.value_or(o.decay_iters * g);
  warmup_ = o.warmup_samples.value_or(static_cast<double>(o.warmup_iters * g));
  wsd_decay_ = o.wsd_decay_samples.value_or(o.wsd_decay_iters * g);
  // The flags are named in the unit they were given in (Megatron's assertions, as one-line errors).
  const bool samples = o.decay_samples.has_value();
  const auto count = [&](double v) { return samples ? v : v / static_cast<double>(g); };
  const char* unit = samples ? "samples" : "iters";
  if (decay_ <= 0) fail(fmt::format("--lr-decay-{}: {} must be positive", unit, count(static_cast<double>(decay_))));
  if (!(warmup_ >= 0) || warmup_ >= static_cast<double>(decay_))
    fail(fmt::format("--lr-warmup-{} {} must be below --lr-decay-{} {}", o.warmup_samples ? "samples" : "iters",
                     o.warmup_samples ? warmup_ : count(warmup_), unit, count(static_cast<double>(decay_))));
  if (o.style == LrDecayStyle::kWsd && (wsd_decay_ <= 0 || wsd_decay_ > decay_))
    fail(fmt::format("--lr-wsd-decay-{}: {} must be in [1, {}] with --lr-decay-style WSD",
                     o.wsd_decay_samples ? "samples" : "iters", count(static_cast<double>(wsd_decay_)),
                     count(static_cast<double>(decay_))));
}

double LrSchedule::at(std::int64_t iteration) const {
  // Megatron's units: samples. Integers below 2^53 are exact as doubles, so the double arithmetic below is
  // Python's int/float arithmetic of get_lr.
  const LrScheduleOptions& o = options_;
  const double step = static_cast<double>(iteration * o.global_batch_size);
  const double warmup = warmup_, decay = static_cast<double>(decay_);
  const double pi = std::numbers::pi;
  if (warmup > 0 && step <= warmup) return o.init_lr + (o.max_lr - o.init_lr) * step / warmup;
  if (o.style == LrDecayStyle::kConstant) return o.max_lr;
  if (step > decay) return o.min_lr;
  if (o.style == LrDecayStyle::kInverseSquareRoot)
    return std::max(o.min_lr, o.max_lr * std::sqrt(std::max(warmup, 1.0)) / std::sqrt(std::max(step, 1.0)));
  const double ratio = (step - warmup) / (decay - warmup);
  double coeff = 1.0;
  switch (o.style) {
    case LrDecayStyle::kLinear: coeff = 1.0 - ratio; break;
    case LrDecayStyle::kCosine: coeff = 0.5 * (std::cos(pi * ratio) + 1.0); break;
    case LrDecayStyle::kWsd: {
      const double anneal_start = decay - static_cast<double>(wsd_decay_);
      if (step <= anneal_start) break;
      const double w = (step - anneal_start) / static_cast<double>(wsd_decay_);
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
