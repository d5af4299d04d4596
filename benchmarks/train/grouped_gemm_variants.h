// The grouped GEMM's other tile schedules (grouped_gemm_variants.cu), with the library's launch contract
// (backend/cuda/grouped_gemm.h: GroupedLaunch; false where the kernel refused or the build has no CUTLASS).
#pragma once

#include "backend/cuda/grouped_gemm.h"

namespace dlm::train::cuda {
std::size_t grouped_nt_pingpong_workspace(const GroupedLaunch& l);
bool grouped_nt_pingpong(const GroupedLaunch& l, cudaStream_t stream);
std::size_t grouped_nt_coop256_workspace(const GroupedLaunch& l);
bool grouped_nt_coop256(const GroupedLaunch& l, cudaStream_t stream);
std::size_t grouped_tn_cooperative_workspace(const GroupedLaunch& l);
bool grouped_tn_cooperative(const GroupedLaunch& l, cudaStream_t stream);
}  // namespace dlm::train::cuda
