// What the kernel benchmarks share: device buffers, random bf16 operands (the tensor cores draw more power on
// random data than on zeros and clock lower, as in training, so timings on zeros would flatter the kernels), and
// the timed loop.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/kernels.h"

namespace dlm::bench {

// n elements of T in device memory (dlm::Error when the GPU has no room); the benchmarks free them or exit.
template <typename T>
T* device_alloc(std::size_t n) {
  void* p = nullptr;
  train::cuda::check_cuda(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

// Milliseconds per call of f over `reps` calls on `stream`, after two untimed calls (the first builds plans and
// loads kernels).
template <typename F>
double time_ms(F&& f, int reps, cudaStream_t stream = nullptr) {
  cudaEvent_t a = nullptr, b = nullptr;
  train::cuda::check_cuda(cudaEventCreate(&a), "event"), train::cuda::check_cuda(cudaEventCreate(&b), "event");
  f(), f();
  train::cuda::check_cuda(cudaEventRecord(a, stream), "event");
  for (int i = 0; i < reps; ++i) f();
  train::cuda::check_cuda(cudaEventRecord(b, stream), "event");
  train::cuda::check_cuda(cudaEventSynchronize(b), "event");
  float ms = 0;
  train::cuda::check_cuda(cudaEventElapsedTime(&ms, a, b), "event");
  cudaEventDestroy(a), cudaEventDestroy(b);
  return ms / reps;
}

// n bf16 values uniform in [-0.5, 0.5) from a fixed xorshift stream (fast enough for 10^9 of them), uploaded.
inline void fill_random(void* device, std::size_t n, std::uint64_t seed = 0x9E3779B97F4A7C15ull) {
  std::vector<__nv_bfloat16> host(n);
  std::uint64_t r = seed;
  for (auto& x : host) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    const std::uint32_t bits = 0x3F800000u | static_cast<std::uint32_t>(r & 0x7FFFFFu);
    float f = 0;
    std::memcpy(&f, &bits, 4);
    x = __float2bfloat16(f - 1.5f);
  }
  train::cuda::check_cuda(cudaMemcpy(device, host.data(), n * 2, cudaMemcpyHostToDevice), "upload");
}

}  // namespace dlm::bench
