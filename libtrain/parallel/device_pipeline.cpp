// The 1F1B schedule over device-memory stages (see include/dlm/train/device_pipeline.h).
#include "dlm/train/device_pipeline.h"

#include <algorithm>
#include <map>
#include <vector>

namespace dlm::train {
namespace {

class StageRun {
 public:
  StageRun(PipelineStage& stage, DeviceGroup* pipeline)
      : s_(stage), pp_(pipeline), P_(pipeline ? pipeline->size() : 1), r_(pipeline ? pipeline->rank() : 0),
        n_(stage.boundary_elements()) {}
  int stages() const { return P_; }
  int rank() const { return r_; }

  // One group of transfers: any of the four directions Megatron pairs (recv_forward_mb < 0: none).
  void transfers(int recv_forward_mb, bool send_forward, bool recv_backward, bool send_backward) {
    const bool first = r_ == 0, last = r_ == P_ - 1;
    std::vector<DeviceGroup::Transfer> t;
    if (send_forward && !last) t.push_back({true, const_cast<void*>(s_.output()), n_, DeviceElement::kBF16, r_ + 1});
    if (recv_backward && !last) t.push_back({false, s_.output_grad(), n_, DeviceElement::kF32, r_ + 1});
    if (send_backward && !first)
      t.push_back({true, const_cast<float*>(s_.input_grad()), n_, DeviceElement::kF32, r_ - 1});
    if (recv_forward_mb >= 0 && !first)
      t.push_back({false, s_.input(slot_for(recv_forward_mb)), n_, DeviceElement::kBF16, r_ - 1});
    if (!t.empty()) pp_->exchange(t, s_.stream());
  }
  void forward(int mb, bool training) { s_.forward(mb, slot_for(mb), training); }
  void backward(int mb) {
    s_.backward(mb, slot_of_.at(mb));
    release(mb);
  }
  void release(int mb) {
    free_.push_back(slot_of_.at(mb));
    slot_of_.erase(mb);
  }
  int max_in_flight() const { return max_slots_; }

 private:
  // A micro-batch keeps its slot from its input's arrival (or its forward) to its backward.
  int slot_for(int mb) {
    if (auto it = slot_of_.find(mb); it != slot_of_.end()) return it->second;
    int slot = static_cast<int>(slot_of_.size());
    if (!free_.empty()) slot = free_.back(), free_.pop_back();
    slot_of_[mb] = slot;
    max_slots_ = std::max(max_slots_, static_cast<int>(slot_of_.size()));
    return slot;
  }

  PipelineStage& s_;
  DeviceGroup* pp_;
  int P_, r_;
  std::size_t n_;
  std::map<int, int> slot_of_;
  std::vector<int> free_;
  int max_slots_ = 0;
};

}  // namespace

int run_pipeline_1f1b(PipelineStage& stage, DeviceGroup* pipeline, int M, bool training) {
  StageRun run(stage, pipeline);
  if (!training) {
    for (int mb = 0; mb < M; ++mb) {
      run.transfers(mb, false, false, false);
      run.forward(mb, false);
      run.transfers(-1, true, false, false);
      run.release(mb);
    }
    return std::min(M, 1);
  }
  const int warm = std::min(run.stages() - run.rank() - 1, M), steady = M - warm;
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
