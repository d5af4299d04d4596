// The optimizer's memory-bound passes at the 1.7B's size: the gradient norm (reads 4 bytes a parameter) and
// the backend's AdamW (adamw.cu: the master weights as the bf16 weights plus a 16-bit remainder, reads 16 bytes
// and writes 12) beside kernels of the fp32-master layout it replaced (reads 16, writes 14: the master, then
// its bf16 copy), in TB/s, to see how far from the memory's speed each runs. The fp32-layout kernels change
// only how the bytes move:
//   copy:    the fp32 layout's traffic with no arithmetic (its ceiling)
//   cs:      the former backend kernel with streaming (evict-first) loads and stores
//   unroll2: two float4 groups in flight per thread and iteration
// usage: adamw_bench [PARAMS_MILLIONS=1720] [REPEATS=5]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "kernel_bench.h"

namespace {

using dlm::bench::device_alloc;
using dlm::train::cuda::AdamWChunk;
using dlm::train::cuda::AdamWTensor;
using dlm::train::cuda::check_cuda;

constexpr int kThreads = 256;

struct Buffers {
  float *p, *g, *m, *v;
  __nv_bfloat16* p16;  // the fp32 layout's bf16 copy; the backend's upper halves
  std::int16_t* lo;    // the backend's lower halves
  std::int64_t n;
};

__device__ __forceinline__ void update(float g, float& p, float& m, float& v) {
  const float decay = 1.0f - 1e-4f * 0.1f, step = 1e-4f / 0.1f, bc2 = 0.03f;
  p *= decay;
  m += 0.1f * (g - m);
  v = 0.95f * v + 0.05f * g * g;
  p -= step * m / (sqrtf(v) / bc2 + 1e-8f);
}

__global__ void __launch_bounds__(kThreads) copy_kernel(Buffers b, std::int64_t per_block) {
  const std::int64_t begin = blockIdx.x * per_block, end = min(begin + per_block, b.n);
  for (std::int64_t i = begin + 4 * threadIdx.x; i + 3 < end; i += 4 * kThreads) {
    const float4 g = *reinterpret_cast<const float4*>(b.g + i);
    float4 p = *reinterpret_cast<const float4*>(b.p + i), m = *reinterpret_cast<const float4*>(b.m + i);
    float4 v = *reinterpret_cast<const float4*>(b.v + i);
    p.x += g.x, m.y += g.y, v.z += g.z;  // keeps every load live
    *reinterpret_cast<float4*>(b.p + i) = p, *reinterpret_cast<float4*>(b.m + i) = m;
    *reinterpret_cast<float4*>(b.v + i) = v;
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(b.p16 + i);
    out[0] = __floats2bfloat162_rn(p.x, p.y), out[1] = __floats2bfloat162_rn(p.z, p.w);
  }
}

__global__ void __launch_bounds__(kThreads) cs_kernel(Buffers b, std::int64_t per_block) {
  const std::int64_t begin = blockIdx.x * per_block, end = min(begin + per_block, b.n);
  for (std::int64_t i = begin + 4 * threadIdx.x; i + 3 < end; i += 4 * kThreads) {
    const float4 g = __ldcs(reinterpret_cast<const float4*>(b.g + i));
    float4 p = __ldcs(reinterpret_cast<const float4*>(b.p + i)), m = __ldcs(reinterpret_cast<const float4*>(b.m + i));
    float4 v = __ldcs(reinterpret_cast<const float4*>(b.v + i));
    update(g.x, p.x, m.x, v.x), update(g.y, p.y, m.y, v.y), update(g.z, p.z, m.z, v.z), update(g.w, p.w, m.w, v.w);
    __stcs(reinterpret_cast<float4*>(b.p + i), p), __stcs(reinterpret_cast<float4*>(b.m + i), m);
    __stcs(reinterpret_cast<float4*>(b.v + i), v);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const unsigned*>(&lo), packed.y = *reinterpret_cast<const unsigned*>(&hi);
    __stcs(reinterpret_cast<uint2*>(b.p16 + i), packed);
  }
}

__global__ void __launch_bounds__(kThreads) unroll2_kernel(Buffers b, std::int64_t per_block) {
  const std::int64_t begin = blockIdx.x * per_block, end = min(begin + per_block, b.n);
  for (std::int64_t i = begin + 4 * threadIdx.x; i + 4 * kThreads + 3 < end; i += 8 * kThreads) {
    const std::int64_t j = i + 4 * kThreads;
    const float4 g0 = __ldcs(reinterpret_cast<const float4*>(b.g + i));
    const float4 g1 = __ldcs(reinterpret_cast<const float4*>(b.g + j));
    float4 p0 = __ldcs(reinterpret_cast<const float4*>(b.p + i)), p1 = __ldcs(reinterpret_cast<const float4*>(b.p + j));
    float4 m0 = __ldcs(reinterpret_cast<const float4*>(b.m + i)), m1 = __ldcs(reinterpret_cast<const float4*>(b.m + j));
    float4 v0 = __ldcs(reinterpret_cast<const float4*>(b.v + i)), v1 = __ldcs(reinterpret_cast<const float4*>(b.v + j));
    update(g0.x, p0.x, m0.x, v0.x), update(g0.y, p0.y, m0.y, v0.y), update(g0.z, p0.z, m0.z, v0.z);
    update(g0.w, p0.w, m0.w, v0.w);
    update(g1.x, p1.x, m1.x, v1.x), update(g1.y, p1.y, m1.y, v1.y), update(g1.z, p1.z, m1.z, v1.z);
    update(g1.w, p1.w, m1.w, v1.w);
    __stcs(reinterpret_cast<float4*>(b.p + i), p0), __stcs(reinterpret_cast<float4*>(b.m + i), m0);
    __stcs(reinterpret_cast<float4*>(b.v + i), v0);
    __stcs(reinterpret_cast<float4*>(b.p + j), p1), __stcs(reinterpret_cast<float4*>(b.m + j), m1);
    __stcs(reinterpret_cast<float4*>(b.v + j), v1);
    __nv_bfloat162* o0 = reinterpret_cast<__nv_bfloat162*>(b.p16 + i);
    o0[0] = __floats2bfloat162_rn(p0.x, p0.y), o0[1] = __floats2bfloat162_rn(p0.z, p0.w);
    __nv_bfloat162* o1 = reinterpret_cast<__nv_bfloat162*>(b.p16 + j);
    o1[0] = __floats2bfloat162_rn(p1.x, p1.y), o1[1] = __floats2bfloat162_rn(p1.z, p1.w);
  }
}

__global__ void __launch_bounds__(kThreads) sumsq_cs_kernel(const float* g, std::int64_t n, std::int64_t per_block,
                                                            double* partial) {
  const std::int64_t begin = blockIdx.x * per_block, end = min(begin + per_block, n);
  double acc = 0;
  for (std::int64_t i = begin + 4 * threadIdx.x; i + 4 * kThreads + 3 < end; i += 8 * kThreads) {
    const float4 a = __ldcs(reinterpret_cast<const float4*>(g + i));
    const float4 c = __ldcs(reinterpret_cast<const float4*>(g + i + 4 * kThreads));
    // fp32 products of a pair, summed in double: the same terms the backend adds
    acc += double(a.x) * a.x + double(a.y) * a.y + double(a.z) * a.z + double(a.w) * a.w;
    acc += double(c.x) * c.x + double(c.y) * c.y + double(c.z) * c.z + double(c.w) * c.w;
  }
  __shared__ double s[kThreads];
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) s[threadIdx.x] += s[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

}  // namespace

int main(int argc, char** argv) {
  const long millions = argc > 1 ? std::atol(argv[1]) : 1720;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  if (millions < 1 || repeats < 1) {
    std::fprintf(stderr, "adamw_bench: PARAMS_MILLIONS and REPEATS must be positive integers\n");
    return 2;
  }
  try {
    // A multiple of the chunk (65536), so every kernel covers the same elements.
    const std::int64_t n = (millions * 1000000 + 65535) / 65536 * 65536;
    Buffers b{device_alloc<float>(n), device_alloc<float>(n), device_alloc<float>(n), device_alloc<float>(n),
              device_alloc<__nv_bfloat16>(n), device_alloc<std::int16_t>(n), n};
    for (float* x : {b.p, b.g, b.m, b.v}) check_cuda(cudaMemset(x, 0, n * 4), "memset");
    check_cuda(cudaMemset(b.p16, 0, n * 2), "memset");
    check_cuda(cudaMemset(b.lo, 0, n * 2), "memset");
    // The backend's kernels over one tensor of n elements.
    AdamWTensor t{b.p16, b.lo, nullptr, b.g, b.m, b.v, n, 0.1f};
    const auto chunks = dlm::train::cuda::adamw_chunks(&t, 1);
    AdamWTensor* td = device_alloc<AdamWTensor>(1);
    AdamWChunk* cd = device_alloc<AdamWChunk>(chunks.size());
    check_cuda(cudaMemcpy(td, &t, sizeof t, cudaMemcpyHostToDevice), "upload");
    check_cuda(cudaMemcpy(cd, chunks.data(), chunks.size() * sizeof(AdamWChunk), cudaMemcpyHostToDevice), "upload");
    const int blocks = static_cast<int>(chunks.size());
    double* partial = device_alloc<double>(chunks.size());
    double* sumsq = device_alloc<double>(1);
    const double update_bytes = 30.0 * n, split_bytes = 28.0 * n, norm_bytes = 4.0 * n;
    auto time = [&](const char* what, double bytes, const std::function<void()>& run) {
      const double ms = dlm::bench::time_ms(run, repeats);
      std::printf("%-22s %8.3f ms  %5.2f TB/s\n", what, ms, bytes / (ms * 1e9));
    };
    std::printf("adamw_bench: %.3fG parameters\n", n / 1e9);
    const std::int64_t per_block = 65536;
    time("norm (backend)", norm_bytes,
         [&] { dlm::train::cuda::grad_sumsq(td, cd, blocks, partial, sumsq, nullptr); });
    time("norm cs unroll2", norm_bytes, [&] { sumsq_cs_kernel<<<blocks, kThreads>>>(b.g, n, per_block, partial); });
    time("adamw (backend)", split_bytes, [&] {
      dlm::train::cuda::adamw_step(td, cd, blocks, sumsq, 1.0, 1e-4f, 0.9f, 0.95f, 1e-8f, 10, nullptr);
    });
    time("copy (fp32 layout)", update_bytes, [&] { copy_kernel<<<blocks, kThreads>>>(b, per_block); });
    time("adamw cs", update_bytes, [&] { cs_kernel<<<blocks, kThreads>>>(b, per_block); });
    time("adamw cs unroll2", update_bytes, [&] { unroll2_kernel<<<blocks, kThreads>>>(b, per_block); });
    for (std::int64_t pb : {16384, 262144}) {
      const int nb = static_cast<int>((n + pb - 1) / pb);
      time(pb == 16384 ? "adamw cs, 16K a block" : "adamw cs, 256K a block", update_bytes,
           [&] { cs_kernel<<<nb, kThreads>>>(b, pb); });
    }
    check_cuda(cudaGetLastError(), "launch");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "adamw_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
