// multiprocessors(): the current device's multiprocessor count, cached per thread and device (the element-wise
// launchers ask for it ~100 times a step).
#include <cuda_runtime.h>

#include "kernels.h"

namespace dlm::train::cuda {

int multiprocessors() {
  static thread_local int last_device = -1, last_count = 0;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device != last_device) {
    check_cuda(cudaDeviceGetAttribute(&last_count, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
    last_device = device;
  }
  return last_count;
}

}  // namespace dlm::train::cuda
