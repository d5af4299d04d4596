// The MoE layer's six expert GEMMs (moe_layer.h) as the step runs them, one cublasGemmGroupedBatchedEx launch each
// (GroupedGemm), beside one dense cuBLASLt GEMM of the same total size (every expert's rows in one matrix against
// one weight: the rate a perfect grouped GEMM would reach): ms and TFLOP/s per GEMM, for experts that get equal
// rows and for skewed counts (expert e weighted 1 + e, a few experts empty). The shape is moe-2.9b's micro-batch.
// usage: grouped_gemm_bench [TOKENS=8192] [EXPERTS=32] [TOPK=4] [HIDDEN=2048] [FFN=1024]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/gemm.h"
#include "backend/cuda/grouped_gemm.h"
#include "kernel_bench.h"

namespace {

namespace cuda = dlm::train::cuda;
using cuda::bf16;

struct Operands {
  bf16 *x, *w1, *w2, *gu, *act, *y, *dy, *dact, *dgu, *dx, *part;
};

// One GEMM of the layer: per expert e with r_e rows at row o_e, the addresses into `o` and the sizes.
struct Gemm6 {
  const char* what;
  bool ta, tb;
  int m, n, k, lda, ldb, ldc;  // 0 in m or k: the expert's rows
  bf16 *a, *b, *c;
  std::int64_t a_row, b_expert, c_row;  // a: rows of A (or its expert), b: per expert, c: per row (or expert)
  bool weight;                          // a weight gradient: the token rows are k, C is per expert
};

void run(const std::vector<int>& counts, int hidden, int ffn, const Operands& o, cuda::GroupedGemm& grouped,
         cuda::Gemm& dense, const char* label) {
  const int d = hidden, F = ffn, E = static_cast<int>(counts.size());
  int rows = 0;
  std::vector<int> first;
  for (int c : counts) first.push_back(rows), rows += c;
  const Gemm6 gemms[] = {
      {"fc1 fwd", false, true, 0, 2 * F, d, d, d, 2 * F, o.x, o.w1, o.gu, d, 2L * F * d, 2L * F, false},
      {"fc2 fwd", false, true, 0, d, F, F, F, d, o.act, o.w2, o.y, F, 1L * d * F, d, false},
      {"fc2 bwd data", false, false, 0, F, d, d, F, F, o.dy, o.w2, o.dact, d, 1L * d * F, F, false},
      {"fc2 bwd weight", true, false, d, F, 0, d, F, F, o.dy, o.act, o.part, d, F, 1L * d * F, true},
      {"fc1 bwd weight", true, false, 2 * F, d, 0, 2 * F, d, d, o.dgu, o.x, o.part, 2L * F, d, 2L * F * d, true},
      {"fc1 bwd data", false, false, 0, d, 2 * F, 2 * F, d, d, o.dgu, o.w1, o.dx, 2L * F, 2L * F * d, d, false},
  };
  for (const Gemm6& g : gemms) {
    std::vector<const void*> a, b, c;
    cuda::GroupedGemm::Problem p;
    p.trans_a = g.ta, p.trans_b = g.tb, p.lda = g.lda, p.ldb = g.ldb, p.ldc = g.ldc;
    for (int e = 0; e < E; ++e) {
      if (counts[e] == 0) continue;
      const std::int64_t r = first[e];
      p.m.push_back(g.m ? g.m : counts[e]), p.n.push_back(g.n), p.k.push_back(g.k ? g.k : counts[e]);
      a.push_back(g.a + r * g.a_row);
      // A weight gradient's B is the rows' other operand; a data GEMM's B is the expert's weight.
      b.push_back(g.weight ? g.b + r * g.b_expert : g.b + e * g.b_expert);
      c.push_back(g.weight ? g.c + e * g.c_row : g.c + r * g.c_row);
    }
    const void** table = dlm::bench::device_alloc<const void*>(3 * a.size());
    for (auto* v : {&a, &b, &c})
      cuda::check_cuda(cudaMemcpy(table + (v == &a ? 0 : v == &b ? 1 : 2) * a.size(), v->data(), v->size() * 8,
                                  cudaMemcpyHostToDevice),
                       "addresses");
    p.a = table, p.b = table + a.size(), p.c = table + 2 * a.size();
    const double ms = dlm::bench::time_ms([&] { grouped.run(p, nullptr); }, 20);
    // The same work as one dense GEMM: every row against expert 0's weight (or every expert's gradient as one).
    const int m = g.weight ? g.m : rows, k = g.weight ? rows : g.k;
    const double dense_ms = dlm::bench::time_ms(
        [&] { dense.run(g.ta, g.tb, m, g.n, k, g.a, g.lda, g.b, g.ldb, g.c, false, g.ldc, 0.0f, nullptr); }, 20);
    const double flops = 2.0 * rows * g.n * (g.weight ? g.m : g.k);
    std::printf("%-8s %-15s grouped %7.3f ms %6.1f TFLOP/s | one dense GEMM %7.3f ms %6.1f TFLOP/s | %.2fx\n", label,
                g.what, ms, flops / ms / 1e9, dense_ms, flops / dense_ms / 1e9, ms / dense_ms);
    cudaFree(table);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 8192, experts = argc > 2 ? std::atoi(argv[2]) : 32,
            topk = argc > 3 ? std::atoi(argv[3]) : 4, hidden = argc > 4 ? std::atoi(argv[4]) : 2048,
            ffn = argc > 5 ? std::atoi(argv[5]) : 1024;
  if (tokens < 1 || experts < 1 || topk < 1 || hidden % 8 || ffn % 8) {
    std::fprintf(stderr, "usage: grouped_gemm_bench [TOKENS] [EXPERTS] [TOPK] [HIDDEN, a multiple of 8] [FFN, a multiple of 8]\n");
    return 2;
  }
  try {
    const std::size_t rows = static_cast<std::size_t>(tokens) * topk, d = hidden, F = ffn, E = experts;
    Operands o{};
    for (auto [p, n] : {std::pair{&o.x, rows * d}, {&o.w1, E * 2 * F * d}, {&o.w2, E * d * F}, {&o.gu, rows * 2 * F},
                        {&o.act, rows * F}, {&o.y, rows * d}, {&o.dy, rows * d}, {&o.dact, rows * F},
                        {&o.dgu, rows * 2 * F}, {&o.dx, rows * d}, {&o.part, E * 2 * F * d}}) {
      *p = dlm::bench::device_alloc<bf16>(n);
      dlm::bench::fill_random(*p, n, n);
    }
    cuda::GroupedGemm grouped;
    cuda::Gemm dense;
    std::vector<int> equal(E, static_cast<int>(rows / E));
    equal[0] += static_cast<int>(rows - rows / E * E);
    // Skewed: expert e's share 1 + e, the first three empty.
    std::vector<int> skewed(E, 0);
    long long weight = 0;
    for (std::size_t e = 3; e < E; ++e) weight += 1 + static_cast<long long>(e);
    int given = 0;
    for (std::size_t e = 3; e < E; ++e) given += skewed[e] = static_cast<int>(rows * (1 + e) / weight);
    if (E > 3) skewed[E - 1] += static_cast<int>(rows) - given;
    std::printf("tokens %d x top-%d = %zu rows over %d experts, hidden %d, expert FFN %d\n", tokens, topk, rows, experts,
                hidden, ffn);
    run(equal, hidden, ffn, o, grouped, dense, "equal");
    if (E > 3) run(skewed, hidden, ffn, o, grouped, dense, "skewed");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grouped_gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
