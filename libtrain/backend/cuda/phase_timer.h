// PhaseTimer: where a training step's GPU time goes, by phase (CudaOptions::profile). An event is recorded
// on the stream after each phase; the time between consecutive events is charged to the phase that ended.
// Off (the default) it records nothing, so the step stays free of synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dlm::train::cuda {

class PhaseTimer {
 public:
  explicit PhaseTimer(bool enabled = false) : enabled_(enabled) {}
  ~PhaseTimer();
  bool enabled() const { return enabled_; }
  // A model-parallel shard: its steps interleave micro-batches and collectives, phases would mislead.
  void turn_off() { enabled_ = false; }
  void start(cudaStream_t stream);             // the step begins
  void mark(const char* phase, cudaStream_t stream);  // `phase` just ended
  // Synchronises and adds the times to the totals; count_step false for the optimizer's phases, which
  // belong to the step of the forward_backward before them.
  void finish(bool count_step = true);
  // "phase ms share" lines, largest first, over every finished step since the last report; resets.
  std::string report();

 private:
  bool enabled_ = false;
  std::vector<cudaEvent_t> pool_;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
  cudaEvent_t begin_ = nullptr;
  std::size_t used_ = 0;
  std::map<std::string, double> total_ms_;
  int steps_ = 0;
};

}  // namespace dlm::train::cuda
