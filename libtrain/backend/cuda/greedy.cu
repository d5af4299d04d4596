// Per row of bf16 logits: the most likely token among the real vocabulary (the first on ties, as
// torch.argmax) and its probability, 1 / sum_j e^(x_j - max): the greedy x0 and the low-confidence
// remasking score of the diffusion samplers, computed where the logits are.
#include <cfloat>

#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kThreads = 1024;

// A thread's running (max, sum of e^(x - max), first index of the max) over the values it has seen.
struct Running {
  float m = -FLT_MAX, s = 0.0f;
  int arg;
  // x_j with j above every index seen so far.
  __device__ __forceinline__ void see(float v, int j) {
    if (v > m) s = s * __expf(m - v) + 1.0f, m = v, arg = j;
    else s += __expf(v - m);
  }
  // Another thread's: the larger max, the sums rescaled to it, the lower index on equal maxima.
  __device__ __forceinline__ void merge(float m2, float s2, int a2) {
    const float top = fmaxf(m, m2);
    s = s * __expf(m - top) + s2 * __expf(m2 - top);
    if (m2 > m || (m2 == m && a2 < arg)) arg = a2;
    m = top;
  }
  __device__ __forceinline__ void merge_lanes() {
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge(m2, s2, __shfl_xor_sync(0xffffffffu, arg, o));
    }
  }
};

// One block a row, one pass over it (the softmax's sum rescaled as the max grows), 16-byte loads where the rows
// allow them: a step's head rows are few, so the pass's latency, not its bytes, is what the step waits for.
__global__ void __launch_bounds__(kThreads) greedy_kernel(const bf16* logits, std::int64_t ld, int vocab, int* token,
                                                          float* confidence) {
  __shared__ float sm[kThreads / 32], ss[kThreads / 32];
  __shared__ int sa[kThreads / 32];
  const bf16* x = logits + static_cast<std::int64_t>(blockIdx.x) * ld;
  Running r;
  r.arg = vocab;
  int j = threadIdx.x;
  if (ld % 8 == 0) {
    // kBatch vectors' loads issued before any is used, so that their latencies overlap.
    constexpr int kBatch = 4;
    const int vecs = vocab / 8;
    const auto* xv = reinterpret_cast<const Bf16x8*>(x);
    for (int v0 = threadIdx.x; v0 < vecs; v0 += kBatch * kThreads) {
      Bf16x8 p[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (v0 + b * kThreads < vecs) p[b] = xv[v0 + b * kThreads];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int v = v0 + b * kThreads;
        if (v >= vecs) break;
        float a[8];
        unpack8(p[b], a);
#pragma unroll
        for (int i = 0; i < 8; ++i) r.see(a[i], 8 * v + i);
      }
    }
    j = 8 * vecs + threadIdx.x;  // the tail past the last whole vector
  }
  for (; j < vocab; j += kThreads) r.see(__bfloat162float(x[j]), j);
  r.merge_lanes();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sm[warp] = r.m, ss[warp] = r.s, sa[warp] = r.arg;
  __syncthreads();
  if (warp == 0) {
    Running t;
    t.arg = vocab;
    if (lane < kThreads / 32) t.m = sm[lane], t.s = ss[lane], t.arg = sa[lane];
    t.merge_lanes();
    if (lane == 0) token[blockIdx.x] = t.arg, confidence[blockIdx.x] = 1.0f / t.s;
  }
}

}  // namespace

void greedy_tokens(const bf16* logits, std::int64_t ld, int rows, int vocab, int* token, float* confidence,
                   cudaStream_t stream) {
  if (rows > 0) greedy_kernel<<<rows, kThreads, 0, stream>>>(logits, ld, vocab, token, confidence);
}

}  // namespace dlm::train::cuda
