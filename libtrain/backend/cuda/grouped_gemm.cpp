#include "grouped_gemm.h"

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(fmt::format("cuBLAS: {}: status {}", what, static_cast<int>(status)));
}

}  // namespace

GroupedGemm::GroupedGemm() {
  check_blas(cublasCreate(&handle_), "create");
  check_cuda(cudaMalloc(&workspace_, kWorkspaceBytes), "grouped GEMM workspace");
  check_blas(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes), "workspace");
}

GroupedGemm::~GroupedGemm() {
  if (handle_) cublasDestroy(handle_);
  if (workspace_) cudaFree(workspace_);
}

void GroupedGemm::run(const Problem& p, cudaStream_t stream) {
  const std::size_t groups = p.m.size();
  if (groups == 0) return;
  if (p.n.size() != groups || p.k.size() != groups)
    fail(fmt::format("grouped GEMM: {} m, {} n and {} k sizes", groups, p.n.size(), p.k.size()));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B's memory is cuBLAS's first operand.
  ta_.assign(groups, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  tb_.assign(groups, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  lda_.assign(groups, p.ldb), ldb_.assign(groups, p.lda), ldc_.assign(groups, p.ldc), ones_.assign(groups, 1);
  alpha_.assign(groups, 1.0f), beta_.assign(groups, 0.0f);
  check_blas(cublasSetStream(handle_, stream), "set stream");
  check_blas(cublasGemmGroupedBatchedEx(handle_, ta_.data(), tb_.data(), p.n.data(), p.m.data(), p.k.data(),
                                        alpha_.data(), p.b, CUDA_R_16BF,
                                        lda_.data(), p.a, CUDA_R_16BF,
                                        ldb_.data(), beta_.data(), const_cast<void* const*>(p.c), CUDA_R_16BF,
                                        ldc_.data(), static_cast<int>(groups), ones_.data(), CUBLAS_COMPUTE_32F),
             "cublasGemmGroupedBatchedEx");
}

}  // namespace dlm::train::cuda
