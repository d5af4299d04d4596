#include "gemm.h"

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train::cuda {
namespace {

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(fmt::format("cuBLASLt: {}: status {}", what, static_cast<int>(status)));
}

}  // namespace

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(fmt::format("{}: {}", what, cudaGetErrorString(status)));
}

Gemm::Gemm() {
  check_lt(cublasLtCreate(&handle_), "create");
  check_cuda(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc (GEMM workspace)");
}

Gemm::~Gemm() {
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

void Gemm::run(bool trans_a, bool trans_b, int m, int n, int k, const bf16* a, int lda, const bf16* b, int ldb,
               void* c, bool c_f32, int ldc, float beta, cudaStream_t stream) {
  const cudaDataType ctype = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const cublasOperation_t first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &first, sizeof(first));
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &second, sizeof(second));
  // Column-major views: B's memory is [n x k] (or [k x n] transposed), A's is [k x m] (or [m x k]).
  check_lt(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, trans_b ? k : n, trans_b ? n : k, ldb), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, trans_a ? m : k, trans_a ? k : m, lda), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&lc, ctype, n, m, ldc), "layout C");
  // beta is not part of the key: the heuristic does not see it, and a gradient GEMM must run the same algorithm
  // whether it overwrites (the first micro-batch after zero_grad) or adds.
  const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldc, c_f32};
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                         sizeof(workspace_bytes_));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check_lt(cublasLtMatmulAlgoGetHeuristic(handle_, op, la, lb, lc, lc, pref, 1, &result, &found), "heuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) fail(fmt::format("cuBLASLt: no algorithm for {}x{}x{}", m, n, k));
    it = algos_.emplace(key, result.algo).first;
  }
  const float alpha = 1.0f;
  check_lt(cublasLtMatmul(handle_, op, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &it->second, workspace_,
                          workspace_bytes_, stream),
           "matmul");
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
}

}  // namespace dlm::train::cuda
