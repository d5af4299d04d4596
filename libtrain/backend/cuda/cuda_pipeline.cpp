// The 1F1B schedule on the GPU (see cuda_pipeline.h).
#include "cuda_pipeline.h"

#include <algorithm>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train {
namespace {

class StageRun {
 public:
  StageRun(CudaModel& model, DeviceGroup* pipeline)
      : m_(model), pp_(pipeline), P_(pipeline ? pipeline->size() : 1), r_(pipeline ? pipeline->rank() : 0),
        rows_(static_cast<std::size_t>(model.stage_rows() * model.config().hidden_size)) {
    if (P_ != model.shard().layout.pp || r_ != model.shard().stage)
      fail(fmt::format("GPU pipeline: stage {} of {} on pipeline rank {} of {}", model.shard().stage,
                       model.shard().layout.pp, r_, P_));
  }
  bool first() const { return r_ == 0; }
  bool last() const { return r_ == P_ - 1; }

  // One group of transfers: any of the four directions Megatron pairs.
  void transfers(int recv_forward_mb, bool send_forward, bool recv_backward, bool send_backward) {
    std::vector<DeviceGroup::Transfer> t;
    if (send_forward && !last())
      t.push_back({true, const_cast<void*>(m_.stage_output()), rows_, DeviceElement::kBF16, r_ + 1});
    if (recv_backward && !last()) t.push_back({false, m_.stage_output_grad(), rows_, DeviceElement::kF32, r_ + 1});
    if (send_backward && !first())
      t.push_back({true, const_cast<float*>(m_.stage_input_grad()), rows_, DeviceElement::kF32, r_ - 1});
    if (recv_forward_mb >= 0 && !first())
      t.push_back({false, m_.stage_input(slot_for(recv_forward_mb)), rows_, DeviceElement::kBF16, r_ - 1});
    if (!t.empty()) pp_->exchange(t, m_.stream());
  }
  void forward(int mb, bool training) { m_.forward_stage(mb, slot_for(mb), training); }
  void backward(int mb) {
    m_.backward_stage(mb, slot_of_.at(mb));
    release(mb);
  }
  void release(int mb) {
    free_.push_back(slot_of_.at(mb));
    slot_of_.erase(mb);
  }
  int max_in_flight() const { return max_slots_; }

 private:
  // A micro-batch keeps its slot from its input's arrival (or forward) to its backward.
  int slot_for(int mb) {
    if (auto it = slot_of_.find(mb); it != slot_of_.end()) return it->second;
    int slot = static_cast<int>(slot_of_.size());
    if (!free_.empty()) slot = free_.back(), free_.pop_back();
    slot_of_[mb] = slot;
    max_slots_ = std::max(max_slots_, static_cast<int>(slot_of_.size()));
    return slot;
  }

  CudaModel& m_;
  DeviceGroup* pp_;
  int P_, r_;
  std::size_t rows_;
  std::map<int, int> slot_of_;
  std::vector<int> free_;
  int max_slots_ = 0;
};

}  // namespace

int cuda_pipeline_run(CudaModel& model, DeviceGroup* pipeline, int M, bool training) {
  StageRun run(model, pipeline);
  if (!training) {
    for (int mb = 0; mb < M; ++mb) {
      run.transfers(mb, false, false, false);
      run.forward(mb, false);
      run.transfers(-1, true, false, false);
      run.release(mb);
    }
    return 1;
  }
  // The units in pipeline_order()'s order for one chunk per rank; the transfers attach to them as Megatron
  // pairs them.
  const int P = pipeline ? pipeline->size() : 1, r = pipeline ? pipeline->rank() : 0;
  const int warm = std::min(P - r - 1, M), steady = M - warm;
  for (int mb = 0; mb < warm; ++mb) {
    run.transfers(mb, false, false, false);
    run.forward(mb, true);
    run.transfers(-1, true, false, false);
  }
  if (steady > 0) run.transfers(warm, false, false, false);
  for (int i = 0; i < steady; ++i) {
    run.forward(warm + i, true);
    run.transfers(-1, true, true, false);
    run.backward(i);
    run.transfers(i + 1 < steady ? warm + i + 1 : -1, false, false, true);
  }
  for (int mb = steady; mb < M; ++mb) {
    run.transfers(-1, false, true, false);
    run.backward(mb);
    run.transfers(-1, false, false, true);
  }
  return run.max_in_flight();
}

}  // namespace dlm::train
