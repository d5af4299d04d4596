// cuda_grad_reduce.h: bucketed data-parallel all-reduce of a CudaModel's gradients behind its backward.
#include "dlm/train/cuda_grad_reduce.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "dlm/common/error.h"
#include "kernels.h"

namespace dlm::train {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

CudaGradReducer::CudaGradReducer(CudaModel& model, DeviceGroup& data, std::int64_t bucket_elements,
                                 void* comm_stream)
    : model_(model), data_(data), bucket_(std::max<std::int64_t>(bucket_elements, 1)) {
  const auto whole = model.gradient_buffer();
  base_ = whole.data, end_ = whole.numel;
  // Tensor names are global ("decoder.layers.<global index>."), as the hook's layer index.
  layer_begin_.assign(static_cast<std::size_t>(model.config().num_layers), end_);
  for (const auto& t : model.gradient_buffers()) {
    int layer = -1;
    if (std::sscanf(t.name.c_str(), "decoder.layers.%d.", &layer) == 1 && layer >= 0 &&
        layer < model.config().num_layers) {
      auto& begin = layer_begin_[static_cast<std::size_t>(layer)];
      begin = std::min(begin, static_cast<std::int64_t>(t.data - base_));
    }
  }
  cudaEvent_t ready = nullptr, reduced = nullptr;
  cuda::check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "gradient buckets: event");
  cuda::check_cuda(cudaEventCreateWithFlags(&reduced, cudaEventDisableTiming), "gradient buckets: event");
  ready_ = ready, reduced_ = reduced;
  if (comm_stream) {
    comm_ = comm_stream;
  } else {
    cudaStream_t s = nullptr;
    cuda::check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "gradient buckets: stream");
    comm_ = s, own_stream_ = true;
  }
}

CudaGradReducer::~CudaGradReducer() {
  model_.set_backward_layer_hook({});
  cudaEventDestroy(as_event(ready_));
  cudaEventDestroy(as_event(reduced_));
  if (own_stream_) cudaStreamDestroy(as_stream(comm_));
}

void CudaGradReducer::start() {
  pending_end_ = end_, buckets_ = 0, in_backward_ = 0, started_ = true;
  model_.set_backward_layer_hook([this](int layer) { layer_done(layer); });
}

void CudaGradReducer::layer_done(int layer) {
  if (!started_ || layer < 0 || layer >= static_cast<int>(layer_begin_.size())) return;
  const std::int64_t begin = layer_begin_[static_cast<std::size_t>(layer)];
  if (begin < pending_end_ && pending_end_ - begin >= bucket_) {
    reduce(begin);
    ++in_backward_;
  }
}

void CudaGradReducer::finish() {
  model_.set_backward_layer_hook({});
  if (!started_) return;
  if (pending_end_ > 0) reduce(0);
  // Clipping, AdamW and the next zero_grad run behind every bucket's sum.
  cuda::check_cuda(cudaEventRecord(as_event(reduced_), as_stream(comm_)), "gradient buckets: record");
  cuda::check_cuda(cudaStreamWaitEvent(as_stream(model_.stream()), as_event(reduced_), 0), "gradient buckets: wait");
  started_ = false;
}

void CudaGradReducer::reduce(std::int64_t begin) {
  // The comm stream waits on the device for the kernels enqueued so far (this bucket's last gradients).
  cuda::check_cuda(cudaEventRecord(as_event(ready_), as_stream(model_.stream())), "gradient buckets: record");
  cuda::check_cuda(cudaStreamWaitEvent(as_stream(comm_), as_event(ready_), 0), "gradient buckets: wait");
  data_.all_reduce(base_ + begin, static_cast<std::size_t>(pending_end_ - begin), DeviceElement::kF32, comm_);
  pending_end_ = begin, ++buckets_;
}

}  // namespace dlm::train
