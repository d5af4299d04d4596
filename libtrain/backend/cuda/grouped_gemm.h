// The experts' GEMMs as one grouped launch each (cuBLAS's cublasGemmGroupedBatchedEx), in row-major terms as
// Gemm (gemm.h): per group g,  C_g[m_g, n_g] = op(A_g) op(B_g),  op(A_g) [m_g, k_g], op(B_g) [k_g, n_g],
// bf16 operands and output, fp32 accumulation, C overwritten. cuBLAS takes the groups' sizes on the host and the
// operands' addresses on the device: the caller downloads the experts' row counts once per layer (a host wait
// per MoE layer's forward), leaves out the groups with no rows, and writes the address arrays (one entry a group).
// Every output is bf16, the weight gradients too (one output type, the operands' own), which
// moe_accumulate_experts adds into the fp32 gradients.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "kernels.h"

namespace dlm::train::cuda {

class GroupedGemm {
 public:
  GroupedGemm();
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  struct Problem {
    bool trans_a = false, trans_b = false;
    int lda = 0, ldb = 0, ldc = 0;  // the same for every group
    std::vector<int> m, n, k;        // per group, none 0
    // Device arrays of one address a group (bf16 matrices; C is written).
    const void* const* a = nullptr;
    const void* const* b = nullptr;
    const void* const* c = nullptr;
  };
  void run(const Problem& p, cudaStream_t stream);

 private:
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  // run()'s per-group host arrays, kept between calls.
  std::vector<cublasOperation_t> ta_, tb_;
  std::vector<int> lda_, ldb_, ldc_, ones_;
  std::vector<float> alpha_, beta_;
};

}  // namespace dlm::train::cuda
