// StateCopy: a ParameterStore's checkpoint state (fp32 master weights and AdamW moments, every tensor) copied to
// pinned host memory behind the training stream's back, for --async-save and the blocking save alike.
//
// enqueue() is all the training thread pays: on a stream of its own that first waits (on the device) for the work
// the training stream has enqueued so far, each tensor's master weights are joined from their halves
// (master_split.h) into a device scratch buffer, piece by piece, and copied out, and its moments copied straight
// from the flat buffers; an event marks the end. Until that event, nothing may write the weights or the moments:
// order_writes() makes the training stream wait for it (a device-side wait, free for the host), and CudaModel calls
// it before every such write (the next AdamW step, imports, the embedding's catch-up). wait() blocks the calling
// thread (the background writer's) until the copies have landed; the views then hold them until the next enqueue().
//
// Host layout: every tensor's masters, then every tensor's exp_avg, then every exp_avg_sq, each tensor starting
// 4 KiB-aligned, so the checkpoint writer's O_DIRECT writes go straight from this memory. The memory (12 bytes a
// parameter, pinned) and the scratch (kScratch floats on the device) are allocated once, by reserve() or the
// first enqueue(), and kept. Whole tensors only: a store with optimizer shards has no whole moments to copy.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "parameter_store.h"

namespace dlm::train::cuda {

class StateCopy {
 public:
  StateCopy() = default;
  ~StateCopy();
  StateCopy(const StateCopy&) = delete;
  StateCopy& operator=(const StateCopy&) = delete;

  void reserve(const ParameterStore& store);
  // The copies of `store` as it stands after the work enqueued on `training` so far (the moments only when
  // `moments`: AdamW has stepped). Returns at once.
  void enqueue(const ParameterStore& store, cudaStream_t training, bool moments);
  // Before the training stream writes the weights or moments: it waits for copies still in flight.
  void order_writes(cudaStream_t training) {
    if (in_flight_) order_writes_now(training);
  }
  // Blocks until the last enqueue()'s copies are in host memory (any thread).
  void wait() const;

  bool reserved() const { return host_ != nullptr; }
  std::span<const float> master(int p) const { return view(master_at_, p); }
  std::span<const float> exp_avg(int p) const { return view(exp_avg_at_, p); }
  std::span<const float> exp_avg_sq(int p) const { return view(exp_avg_sq_at_, p); }

 private:
  void order_writes_now(cudaStream_t training);
  std::span<const float> view(const std::vector<std::size_t>& at, int p) const {
    return {reinterpret_cast<const float*>(host_ + at[static_cast<std::size_t>(p)]),
            static_cast<std::size_t>(numel_[static_cast<std::size_t>(p)])};
  }

  std::byte* host_ = nullptr;  // pinned
  std::size_t bytes_ = 0;
  std::vector<std::size_t> master_at_, exp_avg_at_, exp_avg_sq_at_;  // byte offsets into host_
  std::vector<std::int64_t> numel_;
  float* scratch_ = nullptr;  // device: the joined masters on their way out
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;  // the training stream's point of the copy; the copies' end
  int device_ = 0;
  bool in_flight_ = false;  // enqueued, and the training stream not yet ordered after it
};

}  // namespace dlm::train::cuda
