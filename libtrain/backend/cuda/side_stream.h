// A second stream that work forks onto from the model's stream and joins back from, through events (so a CUDA graph
// capture follows the fork and the join): the MoE layer's shared expert runs on it beside the routed experts.
//   fork(main): the side stream waits for everything enqueued on main so far;
//   join(main): main waits for everything enqueued on the side stream so far.
#pragma once

#include <cuda_runtime.h>

#include "cuda_check.h"

namespace dlm::train::cuda {

class SideStream {
 public:
  SideStream() {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "side stream");
    check_cuda(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming), "side stream: event");
    check_cuda(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming), "side stream: event");
  }
  ~SideStream() {
    cudaEventDestroy(forked_), cudaEventDestroy(joined_);
    cudaStreamDestroy(stream_);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t get() const { return stream_; }
  void fork(cudaStream_t main) {
    check_cuda(cudaEventRecord(forked_, main), "side stream: fork");
    check_cuda(cudaStreamWaitEvent(stream_, forked_, 0), "side stream: fork");
  }
  void join(cudaStream_t main) {
    check_cuda(cudaEventRecord(joined_, stream_), "side stream: join");
    check_cuda(cudaStreamWaitEvent(main, joined_, 0), "side stream: join");
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t forked_ = nullptr, joined_ = nullptr;
};

}  // namespace dlm::train::cuda
