// The training step's attention alone (backend/cuda/attention_cudnn.h: cuDNN's fused flash attention, or the own
// kernels), forward and backward at the benchmark models' shapes, each also with as many KV heads as query heads
// (MHA): whether sharing K and V between query heads (GQA) costs the backward more than the copy and the sum an
// expansion to MHA would add. One line per shape and pass: ms and TFLOP/s (4 B S^2 H D forward, 2.5x backward).
// Where the attention reads V from the QKV projection's own layout (cuDNN: Attention::reads_v_from_projection, what
// the training step runs) a second line times that form, against the first line's V in the attention layout.
// usage: attention_bench [REPS=10]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/attention_cudnn.h"
#include "kernel_bench.h"

namespace {

using dlm::train::cuda::bf16;
using dlm::train::cuda::check_cuda;

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  if (reps < 1) {
    std::fprintf(stderr, "attention_bench: REPS must be a positive integer\n");
    return 2;
  }
  struct Case {
    const char* what;
    dlm::train::cuda::AttentionShape s;
  };
  const Case cases[] = {
      {"350M GQA", {8, 2048, 16, 8, 64, false}},  {"350M as MHA", {8, 2048, 16, 16, 64, false}},
      {"1.7B GQA", {4, 2048, 16, 8, 128, false}}, {"1.7B as MHA", {4, 2048, 16, 16, 128, false}},
  };
  try {
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreate(&stream), "stream");
    for (const auto& c : cases) {
      const auto& s = c.s;
      const std::size_t tokens = std::size_t(s.batch) * s.seq, D = s.head_dim;
      const std::size_t nqkv = tokens * (s.heads + 2 * s.groups) * D, no = tokens * s.heads * D;
      void *qkv = nullptr, *o = nullptr, *dout = nullptr, *dqkv = nullptr, *lse = nullptr, *delta = nullptr;
      check_cuda(cudaMalloc(&qkv, nqkv * 2), "qkv"), check_cuda(cudaMalloc(&dqkv, nqkv * 2), "dqkv");
      check_cuda(cudaMalloc(&o, no * 2), "o"), check_cuda(cudaMalloc(&dout, no * 2), "dout");
      check_cuda(cudaMalloc(&lse, std::size_t(s.batch) * s.heads * s.seq * 4), "lse");
      check_cuda(cudaMalloc(&delta, std::size_t(s.batch) * s.heads * s.seq * 4), "delta");
      dlm::bench::fill_random(qkv, nqkv), dlm::bench::fill_random(dout, no, 0xD1B54A32D192ED03ull);
      dlm::train::cuda::Attention attention;
      const auto* q = static_cast<const bf16*>(qkv);
      auto* lse_f = static_cast<float*>(lse);
      const double fwd = dlm::bench::time_ms([&] { attention.forward(s, q, static_cast<bf16*>(o), lse_f, stream); }, reps, stream);
      const double bwd = dlm::bench::time_ms(
          [&] {
            attention.backward(s, q, static_cast<const bf16*>(o), static_cast<const bf16*>(dout), lse_f,
                               static_cast<float*>(delta), static_cast<bf16*>(dqkv), stream);
          },
          reps, stream);
      const double flops = 4.0 * s.batch * double(s.seq) * s.seq * s.heads * D;
      std::printf("%-12s B %d S %d H %d G %d D %d  forward %.3f ms %4.0f TFLOP/s  "
                  "backward %.3f ms %4.0f TFLOP/s  (%s)\n",
                  c.what, s.batch, s.seq, s.heads, s.groups, s.head_dim, fwd, flops / (fwd * 1e9), bwd,
                  2.5 * flops / (bwd * 1e9), attention.engine().c_str());
      if (attention.reads_v_from_projection(s)) {
        // The projection's grouped layout has the attention layout's size; its v slots are read (and dV written).
        void *proj = nullptr, *dproj = nullptr;
        check_cuda(cudaMalloc(&proj, nqkv * 2), "proj"), check_cuda(cudaMalloc(&dproj, nqkv * 2), "dproj");
        dlm::bench::fill_random(proj, nqkv, 0x2545F4914F6CDD1Dull);
        const auto* p = static_cast<const bf16*>(proj);
        const double pf = dlm::bench::time_ms(
            [&] { attention.forward(s, q, p, static_cast<bf16*>(o), lse_f, stream); }, reps, stream);
        const double pb = dlm::bench::time_ms(
            [&] {
              attention.backward(s, q, p, static_cast<const bf16*>(o), static_cast<const bf16*>(dout), lse_f,
                                 static_cast<float*>(delta), static_cast<bf16*>(dqkv), static_cast<bf16*>(dproj),
                                 stream);
            },
            reps, stream);
        std::printf("%-12s   V read from the projection: forward %.3f ms, backward %.3f ms\n", c.what, pf, pb);
        cudaFree(proj), cudaFree(dproj);
      }
      for (void* p : {qkv, o, dout, dqkv, lse, delta}) cudaFree(p);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
