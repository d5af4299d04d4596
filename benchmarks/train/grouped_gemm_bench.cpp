// The MoE layer's six expert GEMMs (moe_layer.h) as the step runs them, three ways side by side:
//   cutlass  GroupedGemm (grouped_gemm.h): grouped_plan fills the groups' arrays from the device offsets, then one
//            CUTLASS Hopper grouped GEMM; the library's path (no host wait, graph-capturable)
//   cublas   cublasGemmGroupedBatchedEx, the sizes on the host (the groups with rows only), as the layer ran it
//            before: this needs the experts' counts downloaded and a host wait per layer, not counted here
//   dense    one cuBLASLt GEMM of the same total size (every expert's rows in one matrix against one weight: the
//            rate a perfect grouped GEMM would reach)
// and the library's kernel under other tile schedules (grouped_gemm_variants.cu) for the forward and weight forms.
// ms and TFLOP/s per GEMM, for experts that get equal rows and for skewed counts (expert e weighted 1 + e, the first
// three empty). The weight gradients are added into fp32 gradients (beta 1) in all three, and the library's kernel
// also writes over them (beta 0, "overwrite": the first micro-batch after zero_grad); cuBLAS's, where it takes no
// fp32 C for bf16 operands, writes bf16 (beta 0, "bf16 C"). The shape is moe-2.9b's micro-batch.
// usage: grouped_gemm_bench [TOKENS=8192] [EXPERTS=32] [TOPK=4] [HIDDEN=2048] [FFN=1024]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/gemm.h"
#include "backend/cuda/grouped_gemm.h"
#include "grouped_gemm_variants.h"
#include "kernel_bench.h"

namespace {

namespace cuda = dlm::train::cuda;
using cuda::bf16;

struct Operands {
  bf16 *x, *w1, *w2, *gu, *act, *y, *dy, *dact, *dgu, *dx;
  float *g1, *g2;
};

struct Variant {
  const char* name;
  std::size_t (*workspace)(const cuda::GroupedLaunch&);
  bool (*run)(const cuda::GroupedLaunch&, cudaStream_t);
};
const Variant kNtVariants[] = {{"pingpong", cuda::grouped_nt_pingpong_workspace, cuda::grouped_nt_pingpong},
                               {"coop256", cuda::grouped_nt_coop256_workspace, cuda::grouped_nt_coop256}};
const Variant kTnVariants[] = {{"cooperative", cuda::grouped_tn_cooperative_workspace, cuda::grouped_tn_cooperative},
                               {nullptr, nullptr, nullptr}};
constexpr std::size_t kVariantWorkspace = std::size_t{16} << 20;
void* variant_workspace = nullptr;

// The cuBLAS variant: per group g (row-major) C_g = op(A_g) op(B_g) (+ C_g for an fp32 C), sizes on the host.
class CublasGrouped {
 public:
  CublasGrouped() {
    check(cublasCreate(&handle_), "create");
    workspace_ = dlm::bench::device_alloc<char>(kWorkspace);
    check(cublasSetWorkspace(handle_, workspace_, kWorkspace), "workspace");
  }
  ~CublasGrouped() { cublasDestroy(handle_), cudaFree(workspace_); }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B's memory is cuBLAS's first operand.
  cublasStatus_t run(bool ta, bool tb, const std::vector<int>& m, int n, const std::vector<int>& k,
                     const void* const* a, int lda, const void* const* b, int ldb, void* const* c, int ldc, bool c_f32) {
    const std::size_t groups = m.size();
    std::vector<cublasOperation_t> opb(groups, tb ? CUBLAS_OP_T : CUBLAS_OP_N);
    std::vector<cublasOperation_t> opa(groups, ta ? CUBLAS_OP_T : CUBLAS_OP_N);
    std::vector<int> ns(groups, n), ldbs(groups, ldb), ldas(groups, lda), ldcs(groups, ldc), ones(groups, 1);
    std::vector<float> alpha(groups, 1.0f), beta(groups, c_f32 ? 1.0f : 0.0f);
    return cublasGemmGroupedBatchedEx(handle_, opb.data(), opa.data(), ns.data(), m.data(), k.data(), alpha.data(), b,
                                      CUDA_R_16BF, ldbs.data(), a, CUDA_R_16BF, ldas.data(), beta.data(), c,
                                      c_f32 ? CUDA_R_32F : CUDA_R_16BF, ldcs.data(), static_cast<int>(groups),
                                      ones.data(), CUBLAS_COMPUTE_32F);
  }

 private:
  static constexpr std::size_t kWorkspace = std::size_t{32} << 20;
  static void check(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) cuda::check_cuda(cudaErrorUnknown, what);
  }
  cublasHandle_t handle_ = nullptr;
  char* workspace_ = nullptr;
};

// One GEMM of the layer (row-major): per expert e with r_e rows at row o_e,
//   data:   C[o_e.., n] = A[o_e.., k] op(W_e)            (m = r_e)
//   weight: G_e[m, n] += A[o_e.., m]^T B[o_e.., n]         (k = r_e)
struct Gemm6 {
  const char* what;
  cuda::GroupedForm form;
  int m, n, k;  // 0: the expert's rows
  int lda, ldb, ldc;
  const void *a, *b;
  void* c;
  std::int64_t b_expert, c_expert;  // a data GEMM's weight, a weight gradient's slice (elements)
};

void run(const std::vector<int>& counts, int hidden, int ffn, const Operands& o, cuda::GroupedGemm& grouped,
         CublasGrouped& cublas, cuda::Gemm& dense, const char* label) {
  const int d = hidden, F = ffn, E = static_cast<int>(counts.size());
  std::vector<int> off(1, 0);
  for (int c : counts) off.push_back(off.back() + c);
  const int rows = off.back();
  const long long W1 = 2LL * F * d, W2 = 1LL * d * F;
  using Form = cuda::GroupedForm;
  const Gemm6 gemms[] = {
      {"fc1 fwd", Form::kNT, 0, 2 * F, d, d, d, 2 * F, o.x, o.w1, o.gu, W1, 0},
      {"fc2 fwd", Form::kNT, 0, d, F, F, F, d, o.act, o.w2, o.y, W2, 0},
      {"fc2 bwd data", Form::kNN, 0, F, d, d, F, F, o.dy, o.w2, o.dact, W2, 0},
      {"fc2 bwd weight", Form::kTNAccumulate, d, F, 0, d, F, F, o.dy, o.act, o.g2, 0, W2},
      {"fc1 bwd weight", Form::kTNAccumulate, 2 * F, d, 0, 2 * F, d, d, o.dgu, o.x, o.g1, 0, W1},
      {"fc1 bwd data", Form::kNN, 0, d, 2 * F, 2 * F, d, d, o.dgu, o.w1, o.dx, W1, 0},
  };
  int* d_off = dlm::bench::device_alloc<int>(off.size());
  cuda::check_cuda(cudaMemcpy(d_off, off.data(), off.size() * sizeof(int), cudaMemcpyHostToDevice), "offsets");
  char* arrays = dlm::bench::device_alloc<char>(cuda::grouped_args_bytes(E));
  for (const Gemm6& g : gemms) {
    const bool weight = g.form == Form::kTNAccumulate;
    const int eb = weight ? 4 : 2;
    // cutlass: the plan and the grouped GEMM, as the layer runs them.
    cuda::GroupedPlan plan;
    plan.a = {g.a, g.lda, 0, g.lda, 2};
    using Operand = cuda::GroupedOperand;
    plan.b = weight ? Operand{g.b, g.ldb, 0, g.ldb, 2} : Operand{g.b, 0, g.b_expert, g.ldb, 2};
    plan.c = weight ? Operand{g.c, 0, g.c_expert, g.ldc, eb} : Operand{g.c, g.ldc, 0, g.ldc, 2};
    plan.m = g.m, plan.n = g.n, plan.k = g.k;
    plan.out = cuda::grouped_args_at(arrays, E);
    const double ms = dlm::bench::time_ms(
        [&] {
          cuda::grouped_plan(&plan, 1, d_off, E, nullptr);
          grouped.run(g.form, E, plan.out, nullptr);
        },
        20);
    // The other tile schedules of this form, on the same planned arrays (and a weight gradient written over).
    std::string variants;
    if (weight) {
      const double t = dlm::bench::time_ms([&] { grouped.run(g.form, E, plan.out, nullptr, 0.0f); }, 20);
      char line[96];
      std::snprintf(line, sizeof line, " | overwrite %.3f ms %.1f", t, 2.0 * rows * g.n * g.m / t / 1e9);
      variants += line;
    }
    const Variant* forms = g.form == Form::kNT ? kNtVariants : g.form == Form::kTNAccumulate ? kTnVariants : nullptr;
    for (int v = 0; forms && v < 2 && forms[v].name; ++v) {
      cuda::GroupedLaunch l;
      l.groups = E, l.args = plan.out, l.sm_count = cuda::multiprocessors(), l.workspace = variant_workspace;
      if (forms[v].workspace(l) > kVariantWorkspace || !forms[v].run(l, nullptr)) {
        variants += std::string(" | ") + forms[v].name + " refused";
        continue;
      }
      const double t = dlm::bench::time_ms([&] { forms[v].run(l, nullptr); }, 20);
      char line[96];
      const double flop = 2.0 * rows * g.n * (weight ? g.m : g.k);
      std::snprintf(line, sizeof line, " | %s %.3f ms %.1f", forms[v].name, t, flop / t / 1e9);
      variants += line;
    }
    // cublas: the groups with rows, their addresses uploaded once (outside the timing).
    std::vector<int> m, k;
    std::vector<const void*> table;
    for (int e = 0; e < E; ++e)
      if (counts[e] > 0) m.push_back(g.m ? g.m : counts[e]), k.push_back(g.k ? g.k : counts[e]);
    const std::size_t groups = m.size();
    for (int operand = 0; operand < 3; ++operand)
      for (int e = 0; e < E; ++e) {
        if (counts[e] == 0) continue;
        const auto* base = static_cast<const char*>(operand == 0 ? g.a : operand == 1 ? g.b : g.c);
        const std::int64_t per_row = operand == 0 ? g.lda : operand == 1 ? (weight ? g.ldb : 0) : (weight ? 0 : g.ldc);
        const std::int64_t per_expert = operand == 1 ? (weight ? 0 : g.b_expert) : operand == 2 ? g.c_expert : 0;
        table.push_back(base + (off[e] * per_row + e * per_expert) * (operand == 2 ? eb : 2));
      }
    const void** d_table = dlm::bench::device_alloc<const void*>(table.size());
    cuda::check_cuda(cudaMemcpy(d_table, table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice), "table");
    const bool ta = weight, tb = g.form == Form::kNT;
    bool c_f32 = weight;
    const auto cublas_call = [&] {
      return cublas.run(ta, tb, m, g.n, k, d_table, g.lda, d_table + groups, g.ldb,
                        const_cast<void* const*>(d_table + 2 * groups), g.ldc, c_f32);
    };
    bool cublas_ok = cublas_call() == CUBLAS_STATUS_SUCCESS && cudaDeviceSynchronize() == cudaSuccess;
    cudaGetLastError();
    if (!cublas_ok && weight) {  // the bf16 C into the same (fp32-sized) slices
      c_f32 = false;
      cublas_ok = cublas_call() == CUBLAS_STATUS_SUCCESS && cudaDeviceSynchronize() == cudaSuccess;
      cudaGetLastError();
      variants += cublas_ok ? " | cublas with a bf16 C" : "";
    }
    const double cublas_ms = cublas_ok ? dlm::bench::time_ms([&] { cublas_call(); }, 20) : 0.0;
    // dense: every row against expert 0's weight (or every expert's gradient as one, into the bf16 C).
    const int dm = weight ? g.m : rows, dk = weight ? rows : g.k;
    bf16* dense_c = weight ? o.gu : static_cast<bf16*>(g.c);
    const double dense_ms = dlm::bench::time_ms(
        [&] {
          dense.run(ta, tb, dm, g.n, dk, static_cast<const bf16*>(g.a), g.lda, static_cast<const bf16*>(g.b), g.ldb,
                    dense_c, false, g.ldc, 0.0f, nullptr);
        },
        20);
    const double flops = 2.0 * rows * g.n * (weight ? g.m : g.k);
    const auto tflops = [&](double t) { return t > 0 ? flops / t / 1e9 : 0.0; };
    std::printf("%-7s %-15s cutlass %7.3f ms %6.1f TFLOP/s | cublas %7.3f ms %6.1f | dense %7.3f ms %6.1f | "
                "cutlass/dense %.2fx, cublas/cutlass %.2fx%s\n",
                label, g.what, ms, tflops(ms), cublas_ms, tflops(cublas_ms), dense_ms, tflops(dense_ms), ms / dense_ms,
                cublas_ms / ms, variants.c_str());
    cudaFree(d_table);
  }
  cudaFree(arrays), cudaFree(d_off);
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
                        {&o.dgu, rows * 2 * F}, {&o.dx, rows * d}}) {
      *p = dlm::bench::device_alloc<bf16>(n);
      dlm::bench::fill_random(*p, n, n);
    }
    o.g1 = dlm::bench::device_alloc<float>(E * 2 * F * d), o.g2 = dlm::bench::device_alloc<float>(E * d * F);
    cuda::check_cuda(cudaMemset(o.g1, 0, E * 2 * F * d * 4), "zero");
    cuda::check_cuda(cudaMemset(o.g2, 0, E * d * F * 4), "zero");
    cuda::GroupedGemm grouped;
    if (!grouped.available()) {
      std::fprintf(stderr, "grouped_gemm_bench: no CUTLASS Hopper grouped GEMM in this build or on this GPU\n");
      return 1;
    }
    CublasGrouped cublas;
    variant_workspace = dlm::bench::device_alloc<char>(kVariantWorkspace);
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
    run(equal, hidden, ffn, o, grouped, cublas, dense, "equal");
    if (E > 3) run(skewed, hidden, ffn, o, grouped, cublas, dense, "skewed");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grouped_gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
