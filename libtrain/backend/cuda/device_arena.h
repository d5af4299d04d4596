// Device memory owned by one part of CudaModel: its cudaMallocs, counted, and freed together.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda_check.h"

namespace dlm::train::cuda {

class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena() { release(); }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // n elements of T (at least one: a zero-sized buffer still has an address).
  template <typename T>
  T* alloc(std::int64_t n) {
    void* p = nullptr;
    const auto size = static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(T);
    check_cuda(cudaMalloc(&p, size), "cudaMalloc");
    owned_.push_back(p);
    bytes_ += size;
    return static_cast<T*>(p);
  }
  void release() {
    for (void* p : owned_) cudaFree(p);
    owned_.clear();
    bytes_ = 0;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::vector<void*> owned_;
  std::size_t bytes_ = 0;
};

}  // namespace dlm::train::cuda
