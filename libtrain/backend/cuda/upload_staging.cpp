#include "upload_staging.h"

#include <cstring>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "kernels.h"

namespace dlm::train::cuda_detail {

using cuda::check_cuda;

UploadStaging::~UploadStaging() {
  if (pending_) cudaEventSynchronize(copied_);
  if (copied_) cudaEventDestroy(copied_);
  if (buffer_) cudaFreeHost(buffer_);
}

void UploadStaging::begin(std::size_t bytes) {
  if (!copied_) check_cuda(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "upload event");
  if (pending_) check_cuda(cudaEventSynchronize(copied_), "upload");
  pending_ = false;
  used_ = 0;
  if (bytes <= capacity_) return;
  if (buffer_) check_cuda(cudaFreeHost(buffer_), "upload staging");
  buffer_ = nullptr, capacity_ = 0;
  void* p = nullptr;
  check_cuda(cudaMallocHost(&p, bytes), "upload staging (pinned host memory)");
  buffer_ = static_cast<std::byte*>(p), capacity_ = bytes;
}

void UploadStaging::copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (used_ + room(bytes) > capacity_)
    fail(fmt::format("upload staging: {} bytes more than the {} reserved", used_ + room(bytes), capacity_));
  std::byte* at = buffer_ + used_;
  std::memcpy(at, src, bytes);
  used_ += room(bytes);
  check_cuda(cudaMemcpyAsync(dst, at, bytes, cudaMemcpyHostToDevice, stream), "upload");
}

void UploadStaging::end(cudaStream_t stream) {
  check_cuda(cudaEventRecord(copied_, stream), "upload event");
  pending_ = true;
}

}  // namespace dlm::train::cuda_detail
