#include "grouped_gemm.h"

#include <cuda_bf16.h>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(fmt::format("cuBLAS: {}: status {}", what, static_cast<int>(status)));
}

}  // namespace

bool GroupedGemm::computes_fp32_output() {
  constexpr int n = 16;
  std::vector<__nv_bfloat16> ones(n * n, __float2bfloat16(1.0f));
  std::vector<float> c(n * n, 1.0f);
  void *a = nullptr, *out = nullptr, **table = nullptr;
  check_cuda(cudaMalloc(&a, ones.size() * 2), "grouped GEMM probe");
  check_cuda(cudaMalloc(&out, c.size() * 4), "grouped GEMM probe");
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&table), 3 * sizeof(void*)), "grouped GEMM probe");
  void* addresses[3] = {a, a, out};
  check_cuda(cudaMemcpy(a, ones.data(), ones.size() * 2, cudaMemcpyHostToDevice), "grouped GEMM probe");
  check_cuda(cudaMemcpy(out, c.data(), c.size() * 4, cudaMemcpyHostToDevice), "grouped GEMM probe");
  check_cuda(cudaMemcpy(table, addresses, sizeof addresses, cudaMemcpyHostToDevice), "grouped GEMM probe");
  Problem p;
  p.trans_b = true, p.lda = p.ldb = p.ldc = n, p.m = {n}, p.n = {n}, p.k = {n};
  p.a = const_cast<const void* const*>(table), p.b = p.a + 1, p.c = p.a + 2, p.c_f32 = true, p.beta = 1.0f;
  bool ok = launch(p, nullptr) == CUBLAS_STATUS_SUCCESS && cudaDeviceSynchronize() == cudaSuccess &&
            cudaMemcpy(c.data(), out, c.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
  for (float v : c) ok = ok && v == 17.0f;
  cudaGetLastError();  // a refusal leaves no error behind for the model's next check
  cudaFree(a), cudaFree(out), cudaFree(table);
  return ok;
}

GroupedGemm::GroupedGemm() {
  check_blas(cublasCreate(&handle_), "create");
  check_cuda(cudaMalloc(&workspace_, kWorkspaceBytes), "grouped GEMM workspace");
  check_blas(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes), "workspace");
  fp32_output_ = computes_fp32_output();
}

GroupedGemm::~GroupedGemm() {
  if (handle_) cublasDestroy(handle_);
  if (workspace_) cudaFree(workspace_);
}

cublasStatus_t GroupedGemm::launch(const Problem& p, cudaStream_t stream) {
  const std::size_t groups = p.m.size();
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B's memory is cuBLAS's first operand.
  ta_.assign(groups, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  tb_.assign(groups, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  lda_.assign(groups, p.ldb), ldb_.assign(groups, p.lda), ldc_.assign(groups, p.ldc), ones_.assign(groups, 1);
  alpha_.assign(groups, 1.0f), beta_.assign(groups, p.beta);
  if (const cublasStatus_t s = cublasSetStream(handle_, stream); s != CUBLAS_STATUS_SUCCESS) return s;
  return cublasGemmGroupedBatchedEx(handle_, ta_.data(), tb_.data(), p.n.data(), p.m.data(), p.k.data(), alpha_.data(),
                                    p.b, CUDA_R_16BF, lda_.data(), p.a, CUDA_R_16BF, ldb_.data(), beta_.data(),
                                    const_cast<void* const*>(p.c), p.c_f32 ? CUDA_R_32F : CUDA_R_16BF, ldc_.data(),
                                    static_cast<int>(groups), ones_.data(), CUBLAS_COMPUTE_32F);
}

void GroupedGemm::run(const Problem& p, cudaStream_t stream) {
  const std::size_t groups = p.m.size();
  if (groups == 0) return;
  if (p.n.size() != groups || p.k.size() != groups)
    fail(fmt::format("grouped GEMM: {} m, {} n and {} k sizes", groups, p.n.size(), p.k.size()));
  if (p.c_f32 && !fp32_output_) fail("grouped GEMM: an fp32 output, which this cuBLAS does not compute");
  check_blas(launch(p, stream), "cublasGemmGroupedBatchedEx");
}

}  // namespace dlm::train::cuda
