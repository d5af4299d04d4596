// The training step's GEMMs one at a time, each with the first algorithms cuBLASLt's heuristic offers (the
// first is the one the backend runs): TFLOP/s per algorithm, to find shapes where the heuristic's choice
// leaves time on the table. One line per GEMM: the shape, then TFLOP/s of algorithms 0, 1, ... Then per model the
// fc2 backward's data GEMM with SwiGLU's backward fused into its epilogue (SwigluBackwardGemm, what the step runs
// where the kernel is built) beside the pair it replaces (the GEMM into dh, then swiglu_backward), ms a call.
// usage: gemm_bench [ROWS_350M=8192] [ROWS_1.7B=4096] [CANDIDATES=8]   (ROWS: the head's packed rows)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/gemm.h"
#include "backend/cuda/swiglu_gemm.h"
#include "kernel_bench.h"

namespace {

using dlm::train::cuda::bf16;

// The fc2 backward at `tokens` x `hidden` x `ffn`: dgu from dy, W2 and gu, fused and as the unfused pair.
void time_fc2_swiglu(dlm::train::cuda::Gemm& gemm, const char* name, int tokens, int hidden, int ffn) {
  namespace cuda = dlm::train::cuda;
  const std::size_t t = tokens, d = hidden, f = ffn;
  bf16 *dy = dlm::bench::device_alloc<bf16>(t * d), *w2 = dlm::bench::device_alloc<bf16>(d * f);
  bf16 *gu = dlm::bench::device_alloc<bf16>(t * 2 * f), *dgu = dlm::bench::device_alloc<bf16>(t * 2 * f);
  bf16* dh = dlm::bench::device_alloc<bf16>(t * f);
  dlm::bench::fill_random(dy, t * d), dlm::bench::fill_random(w2, d * f, 3), dlm::bench::fill_random(gu, t * 2 * f, 5);
  const double pair = dlm::bench::time_ms(
      [&] {
        gemm.run(false, false, tokens, ffn, hidden, dy, hidden, w2, ffn, dh, false, ffn, 0.0f, nullptr);
        cuda::swiglu_backward(dh, gu, dgu, tokens, ffn, nullptr);
      },
      10);
  cuda::SwigluBackwardGemm fused;
  bool ran = fused.available();
  const double one =
      ran ? dlm::bench::time_ms([&] { ran = fused.run(dy, w2, gu, dgu, tokens, hidden, ffn, nullptr) && ran; }, 10)
          : 0.0;
  cuda::check_cuda(cudaGetLastError(), "fc2 backward");
  if (ran)
    std::printf("%-4s fc2 dX + swiglu bwd %6d x %6d x %6d: fused %.3f ms, GEMM + swiglu_backward %.3f ms\n", name,
                tokens, ffn, hidden, one, pair);
  else
    std::printf("%-4s fc2 dX + swiglu bwd %6d x %6d x %6d: fused not available here, GEMM + swiglu_backward %.3f ms\n",
                name, tokens, ffn, hidden, pair);
  for (void* p : {static_cast<void*>(dy), static_cast<void*>(w2), static_cast<void*>(gu), static_cast<void*>(dgu),
                  static_cast<void*>(dh)})
    cudaFree(p);
}

struct Shape {
  std::string what;
  bool ta, tb;
  int m, n, k;
  bool f32;
};

}  // namespace

int main(int argc, char** argv) {
  const int rows350 = argc > 1 ? std::atoi(argv[1]) : 8192, rows17 = argc > 2 ? std::atoi(argv[2]) : 4096;
  const int candidates = argc > 3 ? std::atoi(argv[3]) : 8;
  if (rows350 < 1 || rows17 < 1 || candidates < 1) {
    std::fprintf(stderr, "gemm_bench: ROWS_350M, ROWS_1.7B and CANDIDATES must be positive integers\n");
    return 2;
  }
  // Row-major Gemm::run terms: C[m, n] = op(A)[m, k] op(B)[k, n]. Every GEMM of a training step: per layer the
  // forward (X W^T), the data gradient (dY W) and the weight gradient (dY^T X, fp32) of qkv, proj, fc1 and fc2
  // at T tokens, and the head's three at the packed row counts.
  struct Model {
    const char* name;
    int tokens, hidden, qkv, q, ffn, vocab, head_rows;
  };
  const Model models[] = {{"350M", 16384, 1024, 2048, 1024, 2816, 50304, rows350},
                          {"1.7B", 8192, 2048, 4096, 2048, 6144, 151936, rows17}};
  std::vector<Shape> shapes;
  for (const Model& m : models) {
    const std::string n = m.name;
    const struct {
      const char* what;
      int out, in;
    } layers[] = {{"qkv", m.qkv, m.hidden}, {"proj", m.hidden, m.q}, {"fc1", 2 * m.ffn, m.hidden},
                  {"fc2", m.hidden, m.ffn}};
    for (const auto& l : layers) {
      shapes.push_back({n + " " + l.what + " fwd", false, true, m.tokens, l.out, l.in, false});
      shapes.push_back({n + " " + l.what + " dX", false, false, m.tokens, l.in, l.out, false});
      shapes.push_back({n + " " + l.what + " dW", true, false, l.out, l.in, m.tokens, true});
    }
    shapes.push_back({n + " logits fwd", false, true, m.head_rows, m.vocab, m.hidden, false});
    shapes.push_back({n + " logits dX", false, false, m.head_rows, m.hidden, m.vocab, false});
    shapes.push_back({n + " logits dW", true, false, m.vocab, m.hidden, m.head_rows, true});
  }
  try {
    dlm::train::cuda::Gemm gemm;
    for (const auto& s : shapes) {
      // Operands as stored: A is [m, k] ([k, m] when transposed), B is [k, n] ([n, k] when transposed).
      const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
      void *a = nullptr, *b = nullptr, *c = nullptr;
      const std::size_t na = std::size_t(s.m) * s.k, nb = std::size_t(s.k) * s.n, nc = std::size_t(s.m) * s.n;
      dlm::train::cuda::check_cuda(cudaMalloc(&a, na * 2), "a"), dlm::train::cuda::check_cuda(cudaMalloc(&b, nb * 2), "b");
      dlm::train::cuda::check_cuda(cudaMalloc(&c, nc * (s.f32 ? 4 : 2)), "c");
      // Random operands: zeros run faster (the tensor cores draw less power and clock higher).
      dlm::bench::fill_random(a, na), dlm::bench::fill_random(b, nb);
      cudaMemset(c, 0, nc * (s.f32 ? 4 : 2));
      const auto ms = gemm.time_candidates(s.ta, s.tb, s.m, s.n, s.k, static_cast<const bf16*>(a), lda,
                                           static_cast<const bf16*>(b), ldb, c, s.f32, s.n, s.f32 ? 1.0f : 0.0f,
                                           candidates, 10, nullptr);
      std::printf("%-16s %6d x %6d x %6d %s:", s.what.c_str(), s.m, s.n, s.k, s.f32 ? "f32" : "b16");
      for (double t : ms) std::printf(" %6.0f", t > 0 ? 2.0 * s.m * s.n * s.k / (t * 1e-3) / 1e12 : -1.0);
      std::printf("  TFLOP/s\n");
      cudaFree(a), cudaFree(b), cudaFree(c);
    }
    for (const Model& m : models) time_fc2_swiglu(gemm, m.name, m.tokens, m.hidden, m.ffn);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
