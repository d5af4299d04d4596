// The experts' GEMMs as one grouped launch each (cuBLAS's cublasGemmGroupedBatchedEx), in row-major terms as
// Gemm (gemm.h): per group g,  C_g[m_g, n_g] = op(A_g) op(B_g) + beta C_g,  op(A_g) [m_g, k_g], op(B_g) [k_g, n_g],
// bf16 operands, fp32 accumulation, C bf16 or fp32. cuBLAS takes the groups' sizes on the host and the operands'
// addresses on the device: the caller downloads the experts' row counts once per layer (a host wait per MoE
// layer's forward), leaves out the groups with no rows, and writes the address arrays (one entry a group).
// An fp32 C (the weight gradients added in place) is used where this cuBLAS computes it: fp32_output(), asked once
// at construction by one small grouped GEMM checked on the host; elsewhere the weight gradients come out in bf16 and
// moe_accumulate_experts adds them into the fp32 gradients.
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
    // Device arrays of one address a group (A and B bf16 matrices; C written).
    const void* const* a = nullptr;
    const void* const* b = nullptr;
    const void* const* c = nullptr;
    bool c_f32 = false;  // C fp32 (only where fp32_output()), else bf16
    float beta = 0.0f;
  };
  void run(const Problem& p, cudaStream_t stream);
  // Whether run() takes an fp32 C for bf16 operands here.
  bool fp32_output() const { return fp32_output_; }

 private:
  cublasStatus_t launch(const Problem& p, cudaStream_t stream);
  // One 16 x 16 x 16 group of ones into an fp32 C of ones with beta 1: true when every element reads 17.
  bool computes_fp32_output();
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  bool fp32_output_ = false;
  // run()'s per-group host arrays, kept between calls.
  std::vector<cublasOperation_t> ta_, tb_;
  std::vector<int> lda_, ldb_, ldc_, ones_;
  std::vector<float> alpha_, beta_;
};

}  // namespace dlm::train::cuda
