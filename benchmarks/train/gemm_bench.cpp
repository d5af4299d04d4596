// The training step's GEMMs one at a time, each with the first algorithms cuBLASLt's heuristic offers (the
// first is the one the backend runs): TFLOP/s per algorithm, to find shapes where the heuristic's choice
// leaves time on the table. One line per GEMM: the shape, then TFLOP/s of algorithms 0, 1, ...
// usage: gemm_bench [ROWS_350M=8192] [ROWS_1.7B=4096] [CANDIDATES=8]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/gemm.h"
#include "random_operands.h"

namespace {

using dlm::train::cuda::bf16;

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
  // Row-major Gemm::run terms: C[m, n] = op(A)[m, k] op(B)[k, n]. The head's three GEMMs (logits, the rows'
  // gradient, the weight gradient) at the packed row counts, and the layers' largest for comparison.
  const std::vector<Shape> shapes = {
      {"350M logits fwd", false, true, rows350, 50304, 1024, false},
      {"350M logits dX", false, false, rows350, 1024, 50304, false},
      {"350M logits dW", true, false, 50304, 1024, rows350, true},
      {"350M fc1 dW", true, false, 5632, 1024, 16384, true},
      {"350M fc1 dX", false, false, 16384, 1024, 5632, false},
      {"1.7B logits fwd", false, true, rows17, 151936, 2048, false},
      {"1.7B logits dX", false, false, rows17, 2048, 151936, false},
      {"1.7B logits dW", true, false, 151936, 2048, rows17, true},
      {"1.7B fc1 dW", true, false, 12288, 2048, 8192, true},
      {"1.7B fc1 dX", false, false, 8192, 2048, 12288, false},
  };
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
