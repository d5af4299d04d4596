// Weighted cross-entropy over the vocabulary, straight from bf16 logits, gradient written in place.
// Rows hold ld columns (the padded vocabulary, a multiple of 8); columns >= vocab never enter the softmax
// (Megatron slices them away) and get a zero gradient.
//   lse = max + log sum exp(x - max)   (one pass: online max and rescaled sum, fp32)
//   loss_r = w_r * (lse - x_label);  dx_v = w_r * (exp(x_v - lse) - [v == label])
// The caller runs it on chunks of rows of the logits GEMM, so neither fp32 logits nor more than one
// chunk of bf16 logits ever exist. Rows with w = 0 get a zero gradient.
#include <cfloat>

#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

__global__ void __launch_bounds__(kThreads) ce_kernel(bf16* logits, std::int64_t ld, const int* labels,
                                                      const float* weights, float* loss, int vocab) {
  const int cols = static_cast<int>(ld);
  __shared__ float sm[32], ss[32];
  const std::int64_t row = blockIdx.x;
  bf16* x = logits + row * ld;
  const float w = weights[row];
  const int vecs = cols / 8;
  auto* xv = reinterpret_cast<Bf16x8*>(x);
  if (w == 0.0f) {
    float z[8] = {};
    for (int v = threadIdx.x; v < vecs; v += kThreads) xv[v] = pack8(z);
    if (threadIdx.x == 0) loss[row] = 0.0f;
    return;
  }
  float m = -FLT_MAX, s = 0.0f;
  for (int v = threadIdx.x; v < vecs; v += kThreads) {
    float a[8];
    unpack8(xv[v], a);
    float mx = -FLT_MAX;
    for (int i = 0; i < 8; ++i) mx = v * 8 + i < vocab ? fmaxf(mx, a[i]) : mx;
    float part = 0.0f;
    for (int i = 0; i < 8; ++i) part += v * 8 + i < vocab ? __expf(a[i] - mx) : 0.0f;
    merge(m, s, mx, part);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sm[warp] = m, ss[warp] = s;
  __syncthreads();
  m = -FLT_MAX, s = 0.0f;
  for (int k = 0; k < kThreads / 32; ++k) merge(m, s, sm[k], ss[k]);
  const float lse = m + __logf(s);
  const int label = labels[row];
  const float x_label = __bfloat162float(x[label]);
  __syncthreads();  // every thread has read x[label] before it is overwritten
  if (threadIdx.x == 0) loss[row] = w * (lse - x_label);
  for (int v = threadIdx.x; v < vecs; v += kThreads) {
    float a[8];
    unpack8(xv[v], a);
    for (int i = 0; i < 8; ++i)
      a[i] = v * 8 + i < vocab ? w * (__expf(a[i] - lse) - (v * 8 + i == label ? 1.0f : 0.0f)) : 0.0f;
    xv[v] = pack8(a);
  }
}

}  // namespace

void cross_entropy_forward_backward(bf16* logits, std::int64_t ld, const int* labels, const float* weights,
                                    float* loss, int rows, int vocab, cudaStream_t stream) {
  if (rows > 0) ce_kernel<<<rows, kThreads, 0, stream>>>(logits, ld, labels, weights, loss, vocab);
}

}  // namespace dlm::train::cuda
