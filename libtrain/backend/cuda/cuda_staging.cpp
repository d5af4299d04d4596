// staged_device_group() for the CUDA backend: the staging copies are CUDA copies, synchronized with the
// model's stream (the group's collectives then run on the host over MPI).
#include <cuda_runtime.h>

#include "../../parallel/staged_device_group.h"
#include "kernels.h"

namespace dlm::train {
namespace {

void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  cuda::check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, st), "staged group");
  cuda::check_cuda(cudaStreamSynchronize(st), "staged group");
}
void to_host(void* host, const void* device, std::size_t bytes, void* stream) {
  copy(host, device, bytes, cudaMemcpyDeviceToHost, stream);
}
void to_device(void* device, const void* host, std::size_t bytes, void* stream) {
  copy(device, host, bytes, cudaMemcpyHostToDevice, stream);
}

}  // namespace

std::unique_ptr<DeviceGroup> staged_device_group(Communicator& host) {
  return make_staged_group(host, {to_host, to_device});
}

}  // namespace dlm::train
