#include "phase_timer.h"

#include <algorithm>

#include <fmt/format.h>

namespace dlm::train::cuda {

PhaseTimer::~PhaseTimer() {
  for (auto e : pool_) cudaEventDestroy(e);
}

void PhaseTimer::start(cudaStream_t stream) {
  if (!enabled_) return;
  marks_.clear();
  used_ = 0;
  mark(nullptr, stream);
}

void PhaseTimer::mark(const char* phase, cudaStream_t stream) {
  if (!enabled_) return;
  if (used_ == pool_.size()) {
    cudaEvent_t e;
    cudaEventCreate(&e);
    pool_.push_back(e);
  }
  cudaEvent_t e = pool_[used_++];
  cudaEventRecord(e, stream);
  marks_.emplace_back(phase, e);
}

void PhaseTimer::finish(bool count_step) {
  if (!enabled_ || marks_.empty()) return;
  cudaEventSynchronize(marks_.back().second);
  for (std::size_t i = 1; i < marks_.size(); ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second);
    total_ms_[marks_[i].first] += ms;
  }
  if (count_step) ++steps_;
}

std::string PhaseTimer::report() {
  std::vector<std::pair<double, std::string>> rows;
  double sum = 0;
  for (const auto& [name, ms] : total_ms_) rows.emplace_back(ms, name), sum += ms;
  std::sort(rows.rbegin(), rows.rend());
  std::string out = fmt::format("phase times over {} step(s), {:.2f} ms per step:\n", steps_, steps_ ? sum / steps_ : 0);
  for (const auto& [ms, name] : rows)
    out += fmt::format("  {:<28} {:9.3f} ms/step {:6.1f}%\n", name, ms / std::max(steps_, 1), 100 * ms / std::max(sum, 1e-9));
  total_ms_.clear();
  steps_ = 0;
  return out;
}

}  // namespace dlm::train::cuda
