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

// The block's row: max m and sum s of exp(x - m) over its first `vocab` columns (online, fp32); every thread
// gets the row's lse = m + log s (-inf when vocab is 0).
__device__ float row_lse(const Bf16x8* xv, int vecs, int vocab, float* sm, float* ss) {
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
  return s > 0.0f ? m + __logf(s) : -INFINITY;
}

// x <- bf16(w * (exp(x - lse) - [column == label])) over the first `vocab` columns, 0 beyond (label < 0: none).
__device__ void write_gradient(Bf16x8* xv, int vecs, int vocab, float w, float lse, int label) {
  for (int v = threadIdx.x; v < vecs; v += kThreads) {
    float a[8];
    unpack8(xv[v], a);
    for (int i = 0; i < 8; ++i)
      a[i] = v * 8 + i < vocab ? w * (__expf(a[i] - lse) - (v * 8 + i == label ? 1.0f : 0.0f)) : 0.0f;
    xv[v] = pack8(a);
  }
}

__device__ void zero_row(Bf16x8* xv, int vecs) {
  float z[8] = {};
  for (int v = threadIdx.x; v < vecs; v += kThreads) xv[v] = pack8(z);
}

__global__ void __launch_bounds__(kThreads) ce_kernel(bf16* logits, std::int64_t ld, const int* labels,
                                                      const float* weights, float* loss, int vocab) {
  __shared__ float sm[32], ss[32];
  const std::int64_t row = blockIdx.x;
  bf16* x = logits + row * ld;
  const float w = weights[row];
  const int vecs = static_cast<int>(ld) / 8;
  auto* xv = reinterpret_cast<Bf16x8*>(x);
  if (w == 0.0f) {
    zero_row(xv, vecs);
    if (threadIdx.x == 0) loss[row] = 0.0f;
    return;
  }
  const float lse = row_lse(xv, vecs, vocab, sm, ss);
  const int label = labels[row];
  const float x_label = __bfloat162float(x[label]);
  __syncthreads();  // every thread has read x[label] before it is overwritten
  if (threadIdx.x == 0) loss[row] = w * (lse - x_label);
  write_gradient(xv, vecs, vocab, w, lse, label);
}

// Tensor parallelism: this rank's columns [first, first + ld) of the padded vocabulary, `vocab` (<= ld) of
// them real. Pass 1 per row: the lse of the local columns and the label's logit where the label is local (0
// elsewhere, so a sum over the group is the label's logit).
__global__ void __launch_bounds__(kThreads) ce_local_kernel(const bf16* logits, std::int64_t ld, const int* labels,
                                                            const float* weights, int first, int vocab,
                                                            float* lse_local, float* label_logit) {
  __shared__ float sm[32], ss[32];
  const std::int64_t row = blockIdx.x;
  const bf16* x = logits + row * ld;
  const int vecs = static_cast<int>(ld) / 8;
  const float lse = row_lse(reinterpret_cast<const Bf16x8*>(x), vecs, vocab, sm, ss);
  if (threadIdx.x != 0) return;
  const int local = labels[row] - first;
  lse_local[row] = lse;
  label_logit[row] = weights[row] != 0.0f && local >= 0 && local < vocab ? __bfloat162float(x[local]) : 0.0f;
}

// Pass 2, after lse_local was gathered [group, rows] and label_logit summed over the group:
//   lse = M + log sum_k exp(lse_k - M), M = max_k lse_k;  loss_r = w (lse - x_label);  gradient as above.
__global__ void __launch_bounds__(kThreads) ce_parallel_kernel(bf16* logits, std::int64_t ld, const int* labels,
                                                               const float* weights, int first, int vocab,
                                                               const float* lse_all, int group, int rows,
                                                               const float* label_logit, float* loss) {
  const std::int64_t row = blockIdx.x;
  auto* xv = reinterpret_cast<Bf16x8*>(logits + row * ld);
  const int vecs = static_cast<int>(ld) / 8;
  const float w = weights[row];
  if (w == 0.0f) {
    zero_row(xv, vecs);
    if (threadIdx.x == 0) loss[row] = 0.0f;
    return;
  }
  float m = -INFINITY;
  for (int k = 0; k < group; ++k) m = fmaxf(m, lse_all[static_cast<std::int64_t>(k) * rows + row]);
  float s = 0.0f;
  for (int k = 0; k < group; ++k) s += __expf(lse_all[static_cast<std::int64_t>(k) * rows + row] - m);
  const float lse = m + __logf(s);
  if (threadIdx.x == 0) loss[row] = w * (lse - label_logit[row]);
  write_gradient(xv, vecs, vocab, w, lse, labels[row] - first);
}

}  // namespace

void cross_entropy_forward_backward(bf16* logits, std::int64_t ld, const int* labels, const float* weights,
                                    float* loss, int rows, int vocab, cudaStream_t stream) {
  if (rows > 0) ce_kernel<<<rows, kThreads, 0, stream>>>(logits, ld, labels, weights, loss, vocab);
}

void vocab_parallel_ce_local(const bf16* logits, std::int64_t ld, const int* labels, const float* weights, int first,
                             int vocab, float* lse_local, float* label_logit, int rows, cudaStream_t stream) {
  if (rows > 0)
    ce_local_kernel<<<rows, kThreads, 0, stream>>>(logits, ld, labels, weights, first, vocab, lse_local, label_logit);
}

void vocab_parallel_ce_backward(bf16* logits, std::int64_t ld, const int* labels, const float* weights, int first,
                                int vocab, const float* lse_all, int group, const float* label_logit, float* loss,
                                int rows, cudaStream_t stream) {
  if (rows > 0)
    ce_parallel_kernel<<<rows, kThreads, 0, stream>>>(logits, ld, labels, weights, first, vocab, lse_all, group, rows,
                                                      label_logit, loss);
}

}  // namespace dlm::train::cuda
