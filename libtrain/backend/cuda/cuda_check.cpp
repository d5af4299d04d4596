#include "cuda_check.h"

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train::cuda {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(fmt::format("{}: {}", what, cudaGetErrorString(status)));
}

}  // namespace dlm::train::cuda
