// The 1F1B and interleaved 1F1B schedules over device-memory stages (see include/dlm/train/device_pipeline.h).
#include "dlm/train/device_pipeline.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/pipeline_schedule.h"

namespace dlm::train {
namespace {

// A stage's (or chunk's) activation slots: a micro-batch keeps its slot from its input's arrival (or its
// forward) to its backward.
class Slots {
 public:
  int slot_for(int mb) {
    if (auto it = slot_of_.find(mb); it != slot_of_.end()) return it->second;
    int slot = static_cast<int>(slot_of_.size());
    if (!free_.empty()) slot = free_.back(), free_.pop_back();
    slot_of_[mb] = slot;
    most_ = std::max(most_, static_cast<int>(slot_of_.size()));
    return slot;
  }
  int release(int mb) {
    const int slot = slot_of_.at(mb);
    free_.push_back(slot);
    slot_of_.erase(mb);
    return slot;
  }
  int most() const { return most_; }

 private:
  std::map<int, int> slot_of_;
  std::vector<int> free_;
  int most_ = 0;
};

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
      t.push_back({false, s_.input(slots_.slot_for(recv_forward_mb)), n_, DeviceElement::kBF16, r_ - 1});
    if (!t.empty()) pp_->exchange(t, s_.stream());
  }
  void forward(int mb, bool training) { s_.forward(mb, slots_.slot_for(mb), training); }
  void backward(int mb) { s_.backward(mb, slots_.release(mb)); }
  void release(int mb) { slots_.release(mb); }
  int max_in_flight() const { return slots_.most(); }

 private:
  PipelineStage& s_;
  DeviceGroup* pp_;
  int P_, r_;
  std::size_t n_;
  Slots slots_;
};

// Megatron's interleaved schedule on rank r of P with V chunks: the order of work is pipeline_order()'s,
// and the transfers are its p2p pairs, one group after each unit (forward_backward_pipelining_with_
// interleaving). The stages form a ring: chunk v of rank P - 1 feeds chunk v + 1 of rank 0. A transfer's
// (chunk, micro-batch) is not sent along; both sides derive it: each rank receives a chunk's inputs in the
// order of its forward units and a chunk's output gradients in the order of its backward units, so the
// k-th arrival of a kind belongs to the k-th unit of that kind that needs one. At most one output gradient
// per chunk is pending at any time (checked by simulation for P <= 4, V <= 3), so one buffer per chunk does;
// all chunks run on one stream, so a receive never overtakes the backward that reads the buffer before it.
class InterleavedRun {
 public:
  InterleavedRun(std::span<PipelineStage* const> chunks, DeviceGroup* pipeline, int M)
      : chunks_(chunks), pp_(pipeline), P_(pipeline->size()), r_(pipeline->rank()),
        V_(static_cast<int>(chunks.size())), M_(M), slots_(chunks.size()) {
    for (PipelineStage* c : chunks)
      if (c->stream() != chunks.front()->stream() || c->boundary_elements() != chunks.front()->boundary_elements())
        fail("interleaved pipeline: the chunks of a rank must share one stream and one boundary size");
    n_ = chunks.front()->boundary_elements();
  }

  int run(bool training) {
    const std::vector<PipelineUnit> order = pipeline_order(P_, r_, V_, M_);
    for (const PipelineUnit& u : order) {
      if (u.forward && !first_stage(u.chunk)) inputs_due_.push_back(u);
      if (!u.forward && !last_stage(u.chunk)) grads_due_.push_back(u);
    }
    const int total = M_ * V_;
    if (!training) return run_forward_only(total);
    const int warm = M_ == P_ ? total : std::min((P_ - r_ - 1) * 2 + (V_ - 1) * P_, total), steady = total - warm;
    // Unit k's chunk; k may be below 0 in the ring rule (Megatron's Python modulo: counted from the end).
    const auto fwd_chunk = [&](int k) { return ((k % (P_ * V_) + P_ * V_) % (P_ * V_)) / P_; };
    const auto bwd_chunk = [&](int k) { return V_ - 1 - fwd_chunk(k); };
    const auto micro_batch = [&](int k) { return (k / (P_ * V_)) * P_ + k % P_; };
    exchange(-1, -1, r_ != 0, false);  // the first forward's input
    for (int k = 0; k < warm; ++k) {
      const int c = fwd_chunk(k);
      forward(c, micro_batch(k), true);
      const bool recv_prev = !(r_ == 0 && fwd_chunk(k + 1) == 0) && k != total - 1;
      const bool recv_next = k == warm - 1 && steady > 0 && !(r_ == P_ - 1 && bwd_chunk(0) == V_ - 1);
      exchange(last_stage(c) ? -1 : c, -1, recv_prev, recv_next);
    }
    for (int i = 0; i < steady; ++i) {
      const int fk = warm + i, fc = fwd_chunk(fk), bc = bwd_chunk(i);
      forward(fc, micro_batch(fk), true);
      backward(bc, micro_batch(i));
      // Megatron's rule for the ring's ends: rank 0 next receives the input of forward unit fk - (P - 1) + 1
      // (none when that is past the last chunk), rank P - 1 the gradient of backward unit i - (P - 1) - 1.
      bool recv_prev = r_ != 0 || fwd_chunk(fk - (P_ - 1)) != V_ - 1;
      const bool recv_next = r_ != P_ - 1 || bwd_chunk(i - (P_ - 1)) != 0;
      if (i == steady - 1) recv_prev = false;
      exchange(last_stage(fc) ? -1 : fc, first_stage(bc) ? -1 : bc, recv_prev, recv_next);
    }
    if (steady == 0 && r_ != P_ - 1) exchange(-1, -1, false, true);
    for (int k = steady; k < total; ++k) {
      const int c = bwd_chunk(k);
      backward(c, micro_batch(k));
      const bool recv_next = !(r_ == P_ - 1 && bwd_chunk(k + 1) == V_ - 1) && k != total - 1;
      exchange(-1, first_stage(c) ? -1 : c, false, recv_next);
    }
    if (!inputs_due_.empty() || !grads_due_.empty())
      fail(fmt::format("interleaved pipeline (rank {}): {} inputs and {} gradients never arrived", r_,
                       inputs_due_.size(), grads_due_.size()));
    int most = 0;
    for (const Slots& s : slots_) most = std::max(most, s.most());
    return most;
  }

 private:
  bool first_stage(int chunk) const { return r_ == 0 && chunk == 0; }
  bool last_stage(int chunk) const { return r_ == P_ - 1 && chunk == V_ - 1; }

  // Forward only: each unit's output goes on as the next unit's input arrives (Megatron's all-warm-up path).
  int run_forward_only(int total) {
    exchange(-1, -1, r_ != 0, false);
    for (int k = 0; k < total; ++k) {
      const int c = (k % (P_ * V_)) / P_, mb = (k / (P_ * V_)) * P_ + k % P_;
      forward(c, mb, false);
      slots_[static_cast<std::size_t>(c)].release(mb);
      const int next = k + 1 < total ? ((k + 1) % (P_ * V_)) / P_ : -1;
      exchange(last_stage(c) ? -1 : c, -1, next >= 0 && !first_stage(next), false);
    }
    return std::min(M_, 1);
  }
  void forward(int c, int mb, bool training) {
    PipelineStage& s = *chunks_[static_cast<std::size_t>(c)];
    s.forward(mb, slots_[static_cast<std::size_t>(c)].slot_for(mb), training);
  }
  void backward(int c, int mb) {
    PipelineStage& s = *chunks_[static_cast<std::size_t>(c)];
    s.backward(mb, slots_[static_cast<std::size_t>(c)].release(mb));
  }
  // One group: chunk send_forward's output to the next rank, chunk send_backward's input gradient to the
  // previous one (-1: none), and the next due input / output gradient received. The order inside the group
  // (sends forward then backward, receives forward then backward) is the same on every rank, which keeps
  // a pair's transfers matched when both directions of the ring join the same two ranks (P = 2).
  void exchange(int send_forward, int send_backward, bool recv_forward, bool recv_backward) {
    const int next = (r_ + 1) % P_, prev = (r_ + P_ - 1) % P_;
    std::vector<DeviceGroup::Transfer> t;
    if (send_forward >= 0)
      t.push_back({true, const_cast<void*>(chunk(send_forward).output()), n_, DeviceElement::kBF16, next});
    if (send_backward >= 0)
      t.push_back({true, const_cast<float*>(chunk(send_backward).input_grad()), n_, DeviceElement::kF32, prev});
    if (recv_forward) {
      const PipelineUnit u = due(inputs_due_, "input");
      t.push_back({false, chunk(u.chunk).input(slots_[static_cast<std::size_t>(u.chunk)].slot_for(u.micro_batch)), n_,
                   DeviceElement::kBF16, prev});
    }
    if (recv_backward) t.push_back({false, chunk(due(grads_due_, "gradient").chunk).output_grad(), n_, DeviceElement::kF32, next});
    if (!t.empty()) pp_->exchange(t, chunks_.front()->stream());
  }
  PipelineUnit due(std::deque<PipelineUnit>& queue, const char* what) {
    if (queue.empty()) fail(fmt::format("interleaved pipeline (rank {}): a receive with no {} due", r_, what));
    const PipelineUnit u = queue.front();
    queue.pop_front();
    return u;
  }
  PipelineStage& chunk(int c) { return *chunks_[static_cast<std::size_t>(c)]; }

  std::span<PipelineStage* const> chunks_;
  DeviceGroup* pp_;
  int P_, r_, V_, M_;
  std::size_t n_ = 0;
  std::vector<Slots> slots_;
  std::deque<PipelineUnit> inputs_due_, grads_due_;
};

}  // namespace

int run_pipeline_interleaved(std::span<PipelineStage* const> chunks, DeviceGroup* pipeline, int micro_batches,
                             bool training) {
  if (chunks.empty() || !pipeline || pipeline->size() < 2)
    fail("interleaved pipeline: needs at least one chunk and a pipeline group of two or more stages");
  check_interleaved_micro_batches(pipeline->size(), micro_batches);
  if (chunks.size() == 1) return run_pipeline_1f1b(*chunks.front(), pipeline, micro_batches, training);
  return InterleavedRun(chunks, pipeline, micro_batches).run(training);
}

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
