// --device: which backend a tool's model runs on; without the CUDA backend the CUDA factories fail here.
#include "dlm/train/device.h"

#include <fmt/format.h>

#include "dlm/common/error.h"
#if DLM_HAVE_CUDA
#include "dlm/train/cuda_model.h"
#endif

namespace dlm::train {

bool cuda_built() {
#if DLM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_present() {
#if DLM_HAVE_CUDA
  return CudaModel::device_available();
#else
  return false;
#endif
}

Device resolve_device(const std::string& flag) {
  if (flag.empty()) return cuda_present() ? Device::kCuda : Device::kCpu;
  if (flag == "cpu") return Device::kCpu;
  if (flag != "cuda") fail(fmt::format("--device: '{}' is not cpu or cuda", flag));
  if (!cuda_built()) fail("--device cuda: this build of dlm has no CUDA backend (built without nvcc)");
  if (!cuda_present()) fail("--device cuda: no CUDA device is visible (driver, CUDA_VISIBLE_DEVICES)");
  return Device::kCuda;
}

std::string_view device_name(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

#if !DLM_HAVE_CUDA
std::unique_ptr<TrainableModel> make_cuda_trainable(const ckpt::ModelConfig&, std::uint64_t, const CudaParallelGroups&,
                                                    const CudaOptions&) {
  fail("--device cuda: this build of dlm has no CUDA backend (built without nvcc)");
}
CudaSampling make_cuda_sampling(const ckpt::ModelConfig&, const ckpt::TensorSet&, const CudaOptions&) {
  fail("--device cuda: this build of dlm has no CUDA backend (built without nvcc)");
}
std::unique_ptr<DeviceGroup> staged_device_group(Communicator&) {
  fail("a device group staged through the host needs the CUDA backend (built without nvcc)");
}
#endif

}  // namespace dlm::train
