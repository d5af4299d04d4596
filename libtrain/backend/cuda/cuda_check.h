// The CUDA backend's one error helper: a CUDA runtime status becomes a dlm::Error. C++17, for nvcc and the model
// code alike.
#pragma once

#include <cuda_runtime.h>

namespace dlm::train::cuda {

// Throws dlm::Error "<what>: <cudaGetErrorString>" when `status` is not cudaSuccess.
void check_cuda(cudaError_t status, const char* what);

}  // namespace dlm::train::cuda
