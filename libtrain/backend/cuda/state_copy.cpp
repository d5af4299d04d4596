#include "state_copy.h"

#include <algorithm>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr std::size_t kHostAlign = 4096;
// Floats of the device scratch the master weights are joined into on their way out: the largest tensor (the
// embedding) goes in pieces of this size. Small beside the activations; large enough that a piece's copy, not
// its launch, takes the time.
constexpr std::int64_t kScratch = 16 << 20;

std::size_t round_up(std::size_t n) { return (n + kHostAlign - 1) / kHostAlign * kHostAlign; }

}  // namespace

StateCopy::~StateCopy() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (host_) cudaFreeHost(host_);
  if (scratch_) cudaFree(scratch_);
  if (ready_) cudaEventDestroy(ready_);
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
}

void StateCopy::reserve(const ParameterStore& store) {
  if (host_) return;
  if (store.sharded()) fail("checkpoint state copy: the optimizer shards hold no whole tensors to copy");
  const std::size_t n = store.specs.size();
  numel_.resize(n);
  std::size_t at = 0;
  for (auto* offsets : {&master_at_, &exp_avg_at_, &exp_avg_sq_at_}) {
    offsets->resize(n);
    for (std::size_t p = 0; p < n; ++p) {
      numel_[p] = store.numel(static_cast<int>(p));
      (*offsets)[p] = at;
      at += round_up(static_cast<std::size_t>(numel_[p]) * sizeof(float));
    }
  }
  check_cuda(cudaGetDevice(&device_), "checkpoint state copy");
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "checkpoint state copy: stream");
  check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "checkpoint state copy: event");
  // The writer's thread sleeps on this one rather than spinning a core the training thread may need.
  check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming | cudaEventBlockingSync),
             "checkpoint state copy: event");
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&scratch_), kScratch * sizeof(float)),
             "checkpoint state copy: device scratch");
  void* host = nullptr;
  check_cuda(cudaHostAlloc(&host, std::max<std::size_t>(at, kHostAlign), cudaHostAllocDefault),
             fmt::format("checkpoint state copy: {} bytes of pinned host memory", at).c_str());
  host_ = static_cast<std::byte*>(host);
  bytes_ = at;
}

void StateCopy::enqueue(const ParameterStore& store, cudaStream_t training, bool moments) {
  reserve(store);
  check_cuda(cudaEventRecord(ready_, training), "checkpoint state copy");
  check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "checkpoint state copy");
  for (std::size_t p = 0; p < numel_.size(); ++p) {
    const std::int64_t n = numel_[p], at = store.offset[p];
    auto* out = reinterpret_cast<float*>(host_ + master_at_[p]);
    // One scratch buffer on one stream: each piece's join runs after the previous piece's copy has read it.
    for (std::int64_t done = 0; done < n; done += kScratch) {
      const std::int64_t piece = std::min(kScratch, n - done);
      join_master(store.w16 + at + done, store.w_lo + at + done, scratch_, piece, stream_);
      check_cuda(cudaMemcpyAsync(out + done, scratch_, static_cast<std::size_t>(piece) * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_),
                 "checkpoint state copy: weights");
    }
    if (!moments) continue;
    const auto bytes = static_cast<std::size_t>(n) * sizeof(float);
    check_cuda(cudaMemcpyAsync(host_ + exp_avg_at_[p], store.m + at, bytes, cudaMemcpyDeviceToHost, stream_),
               "checkpoint state copy: exp_avg");
    check_cuda(cudaMemcpyAsync(host_ + exp_avg_sq_at_[p], store.v + at, bytes, cudaMemcpyDeviceToHost, stream_),
               "checkpoint state copy: exp_avg_sq");
  }
  check_cuda(cudaGetLastError(), "checkpoint state copy: join");
  check_cuda(cudaEventRecord(done_, stream_), "checkpoint state copy");
  in_flight_ = true;
}

void StateCopy::order_writes_now(cudaStream_t training) {
  check_cuda(cudaStreamWaitEvent(training, done_, 0), "checkpoint state copy");
  in_flight_ = false;
}

void StateCopy::wait() const {
  check_cuda(cudaSetDevice(device_), "checkpoint state copy");  // a thread of its own starts on device 0
  check_cuda(cudaEventSynchronize(done_), "checkpoint state copy");
}

}  // namespace dlm::train::cuda
