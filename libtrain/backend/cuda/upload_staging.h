// Pinned host memory that a micro-batch's columns are copied out of. A cudaMemcpyAsync from pageable memory
// may wait for the stream (the driver stages it through its own pinned buffers), so an upload queued while the
// device runs the previous micro-batch would hold the host until that finishes, and the device would then idle
// for the rest of the host's upload work. Copies from pinned memory are queued and return at once.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace dlm::train::cuda_detail {

class UploadStaging {
 public:
  UploadStaging() = default;
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;
  ~UploadStaging();

  // Starts an upload of at most `bytes`: waits until the copies of the previous one have run (the buffer is
  // reused), growing the buffer when it is too small.
  void begin(std::size_t bytes);
  // Copies `bytes` from src into the buffer and queues their copy to the device pointer dst on `stream`.
  void copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);
  // Marks the end of the upload's copies on `stream` (the next begin() waits for it).
  void end(cudaStream_t stream);

  // Room begin() reserves for `bytes` of one copy (each copy starts 256-byte aligned).
  static std::size_t room(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

 private:
  std::byte* buffer_ = nullptr;
  std::size_t capacity_ = 0, used_ = 0;
  cudaEvent_t copied_ = nullptr;
  bool pending_ = false;
};

}  // namespace dlm::train::cuda_detail
