// Per row of bf16 logits: the most likely token among the real vocabulary (the first on ties, as
// torch.argmax) and its probability, 1 / sum_j e^(x_j - max): the greedy x0 and the low-confidence
// remasking score of the diffusion samplers, computed where the logits are.
#include <cfloat>

#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) greedy_kernel(const bf16* logits, std::int64_t ld, int vocab, int* token,
                                                          float* confidence) {
  __shared__ float sm[kThreads / 32];
  __shared__ int si[kThreads / 32];
  __shared__ float ss[32];
  const bf16* x = logits + static_cast<std::int64_t>(blockIdx.x) * ld;
  float m = -FLT_MAX;
  int arg = vocab;
  for (int j = threadIdx.x; j < vocab; j += kThreads) {
    const float v = __bfloat162float(x[j]);
    if (v > m) m = v, arg = j;  // j rises within a thread: the first maximum is kept
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const int a2 = __shfl_xor_sync(0xffffffffu, arg, o);
    if (m2 > m || (m2 == m && a2 < arg)) m = m2, arg = a2;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sm[warp] = m, si[warp] = arg;
  __syncthreads();
  m = sm[0], arg = si[0];
  for (int w = 1; w < kThreads / 32; ++w)
    if (sm[w] > m || (sm[w] == m && si[w] < arg)) m = sm[w], arg = si[w];
  float s = 0.0f;
  for (int j = threadIdx.x; j < vocab; j += kThreads) s += __expf(__bfloat162float(x[j]) - m);
  s = block_sum(s, ss);
  if (threadIdx.x == 0) {
    token[blockIdx.x] = arg;
    confidence[blockIdx.x] = 1.0f / s;
  }
}

}  // namespace

void greedy_tokens(const bf16* logits, std::int64_t ld, int rows, int vocab, int* token, float* confidence,
                   cudaStream_t stream) {
  if (rows > 0) greedy_kernel<<<rows, kThreads, 0, stream>>>(logits, ld, vocab, token, confidence);
}

}  // namespace dlm::train::cuda
