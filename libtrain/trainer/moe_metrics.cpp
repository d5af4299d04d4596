// The step's MoE metrics from the ranks' sums (moe_metrics.h).
#include "dlm/train/moe_metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace dlm::train {
namespace {

// An MoE layer's load: its busiest expert's tokens over the mean (1 is perfectly balanced, E / k the worst).
double max_over_mean(const std::vector<double>& tokens) {
  double sum = 0, most = 0;
  for (double t : tokens) {
    sum += t;
    most = std::max(most, t);
  }
  return sum > 0 ? most * static_cast<double>(tokens.size()) / sum : 0.0;
}

}  // namespace

MoeMetrics moe_metrics(const MoeStepSums& sums, std::int64_t micro_batches) {
  MoeMetrics m;
  m.load_balancing = sums.load_balancing;
  m.z = sums.z;
  const auto width = static_cast<std::size_t>(2 + sums.experts);
  const double per = 1.0 / static_cast<double>(std::max<std::int64_t>(1, micro_batches));
  for (std::size_t l = 0; sums.experts > 0 && (l + 1) * width <= sums.values.size(); ++l) {
    const double* v = sums.values.data() + l * width;
    std::vector<double> tokens(v + 2, v + width);
    double routed = 0;
    for (double t : tokens) routed += t;
    if (routed == 0) continue;  // a dense layer
    m.layers.push_back({static_cast<int>(l), v[0] * per, v[1] * per, std::move(tokens)});
  }
  return m;
}

std::vector<std::pair<std::string, double>> MoeMetrics::losses() const {
  std::vector<std::pair<std::string, double>> out;
  if (layers.empty()) return out;
  double lb = 0, z_sum = 0;
  for (const auto& l : layers) {
    lb += l.load_balancing_loss;
    z_sum += l.z_loss;
  }
  const auto n = static_cast<double>(layers.size());
  if (z) out.emplace_back("z_loss", z_sum / n);
  if (load_balancing) out.emplace_back("load_balancing_loss", lb / n);
  return out;
}

// dlm's line after Megatron's: each MoE layer's load in the logged step.
std::string moe_load_line(const MoeMetrics& m) {
  std::string s = " moe load (max / mean tokens per expert) |";
  for (const auto& l : m.layers) s += fmt::format(" layer {}: {:.3f} |", l.layer, max_over_mean(l.tokens_per_expert));
  return s;
}

double moe_max_load(const MoeMetrics& m) {
  double most = 0;
  for (const auto& l : m.layers) most = std::max(most, max_over_mean(l.tokens_per_expert));
  return most;
}

}  // namespace dlm::train
