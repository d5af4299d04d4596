// Grouped GEMMs whose groups' sizes live in device memory: the MoE experts' GEMMs, one launch each, with no host
// wait for the experts' row counts (so the layer can be captured in a CUDA graph). Row-major terms, per group g:
//   kNT:          C_g [m_g, n_g] = A_g [m_g, k_g] B_g^T     (B_g stored [n_g, k_g]; the forward's fc1 and fc2)
//   kNN:          C_g [m_g, n_g] = A_g [m_g, k_g] B_g       (B_g stored [k_g, n_g]; the backward's data GEMMs)
//   kTNAccumulate: C_g [m_g, n_g] = A_g^T B_g + beta C_g   (A_g stored [k_g, m_g], B_g [k_g, n_g], C_g fp32: the
//                                                             weight gradients, added into the fp32 gradients with
//                                                             beta 1, or written over them with beta 0)
// bf16 operands, fp32 accumulation, C bf16 except kTNAccumulate's. A group with a 0 in its shape is skipped (its C
// is not written), which is what a group of no rows needs (a weight gradient adds nothing), except a weight gradient
// written over with beta 0, whose skipped groups the caller clears (moe_clear_empty_experts).
// The kernels are CUTLASS 3's Hopper ptr-array grouped GEMMs (TMA, wgmma, warp-specialized persistent tiles; the
// same kind torch._grouped_mm runs), reading each group's shape, operand addresses and leading dimensions from the
// device arrays of GroupedArgs; grouped_plan fills those arrays on the device from the experts' row offsets.
// Where there is no such kernel (a build without CUTLASS, a GPU other than compute capability 9.0) available() is
// false and run() fails.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels.h"

namespace dlm::train::cuda {

enum class GroupedForm { kNT, kNN, kTNAccumulate };

// The device arrays of one grouped GEMM, `groups` entries each.
struct GroupedArgs {
  int* shapes = nullptr;  // [groups][3]: m, n, k
  const void** a = nullptr;
  const void** b = nullptr;
  void** c = nullptr;
  std::int64_t *lda = nullptr, *ldb = nullptr, *ldc = nullptr;  // each operand's row stride, in elements
};
// Bytes of GroupedArgs arrays for `groups` groups, and their carving out of `base` (16-byte aligned, that many bytes).
std::size_t grouped_args_bytes(int groups);
GroupedArgs grouped_args_at(void* base, int groups);

// How grouped_plan addresses one operand of group e (the experts, with rows [offsets[e], offsets[e + 1])):
//   base + (offsets[e] * per_row + e * per_expert) * element_bytes,   row stride ld.
struct GroupedOperand {
  const void* base = nullptr;
  std::int64_t per_row = 0, per_expert = 0;
  int ld = 0, element_bytes = 2;
};
// One grouped GEMM over the experts: m, n, k fixed, except the one given as 0, which is each expert's row count.
struct GroupedPlan {
  GroupedOperand a, b, c;
  int m = 0, n = 0, k = 0;
  GroupedArgs out;
};
constexpr int kMaxGroupedPlans = 6;
// Fills every plan's arrays for `groups` experts from offsets [groups + 1] (device), in one launch.
void grouped_plan(const GroupedPlan* plans, int count, const int* offsets, int groups, cudaStream_t stream);

class GroupedGemm {
 public:
  GroupedGemm();
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // Whether this build and device run the kernels (CUTLASS, compute capability 9.0).
  bool available() const { return available_; }
  // Enqueues C_g = ... for `groups` groups described by args (device arrays, filled before it runs on `stream`).
  // Every address 16-byte aligned and every leading dimension a multiple of 8 (4 for the fp32 C). beta: 0 or 1,
  // kTNAccumulate's only. The launches share one workspace: no two may run at once (one stream).
  void run(GroupedForm form, int groups, const GroupedArgs& args, cudaStream_t stream, float beta = 1.0f);

 private:
  bool available_ = false;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

// The instantiations (grouped_gemm_nt.cu, grouped_gemm_nn.cu, grouped_gemm_tn.cu): the workspace a launch needs,
// and the launch itself (false: the kernel refused the arguments, or this build has none).
struct GroupedLaunch {
  int groups = 0;
  GroupedArgs args;
  int sm_count = 0;
  void* workspace = nullptr;
  float beta = 1.0f;  // the fp32 C's (kTNAccumulate)
};
bool grouped_sm90_built();
std::size_t grouped_nt_workspace(const GroupedLaunch& l);
std::size_t grouped_nn_workspace(const GroupedLaunch& l);
std::size_t grouped_tn_workspace(const GroupedLaunch& l);
bool grouped_nt(const GroupedLaunch& l, cudaStream_t stream);
bool grouped_nn(const GroupedLaunch& l, cudaStream_t stream);
bool grouped_tn(const GroupedLaunch& l, cudaStream_t stream);

}  // namespace dlm::train::cuda
