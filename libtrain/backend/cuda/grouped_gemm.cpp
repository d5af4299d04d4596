#include "grouped_gemm.h"

#include <algorithm>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train::cuda {

GroupedGemm::GroupedGemm() {
  int device = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "compute capability");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "compute capability");
  available_ = grouped_sm90_built() && major == 9 && minor == 0;  // sm_90a machine code
  if (!available_) return;
  // The workspace (each multiprocessor's tensor-map copies) depends on the multiprocessor count only: sized once
  // here, so that no launch allocates (a launch may be inside a CUDA graph capture).
  GroupedLaunch probe;
  probe.groups = 1, probe.sm_count = multiprocessors();
  workspace_bytes_ = std::max({grouped_nt_workspace(probe), grouped_nn_workspace(probe), grouped_tn_workspace(probe)});
  if (workspace_bytes_ > 0) check_cuda(cudaMalloc(&workspace_, workspace_bytes_), "grouped GEMM workspace");
}

GroupedGemm::~GroupedGemm() {
  if (workspace_) cudaFree(workspace_);
}

void GroupedGemm::run(GroupedForm form, int groups, const GroupedArgs& args, cudaStream_t stream, float beta) {
  if (groups <= 0) return;
  if (!available_) fail("grouped GEMM: this build or GPU has no CUTLASS Hopper kernel (compute capability 9.0)");
  GroupedLaunch l;
  l.groups = groups, l.args = args, l.sm_count = multiprocessors(), l.workspace = workspace_, l.beta = beta;
  const bool launched = form == GroupedForm::kNT ? grouped_nt(l, stream)
                        : form == GroupedForm::kNN ? grouped_nn(l, stream)
                                                   : grouped_tn(l, stream);
  if (!launched)
    fail(fmt::format("grouped GEMM: CUTLASS refused form {} of {} groups", static_cast<int>(form), groups));
  check_cuda(cudaGetLastError(), "grouped GEMM launch");
}

}  // namespace dlm::train::cuda
