// A DeviceGroup that stages through host memory over a host Communicator (MPI), given how to copy between
// its memory and the host's: the CUDA backend's copies (several ranks on one GPU, where NCCL refuses), or
// plain memcpy (the schedules' tests on CPUs, "device" memory being host memory).
#pragma once

#include <cstddef>
#include <memory>

#include "dlm/train/device_group.h"

namespace dlm::train {

struct StagingCopies {
  // Blocking copies of `bytes` between the group's memory and the host, ordered after the stream's work.
  void (*to_host)(void* host, const void* device, std::size_t bytes, void* stream);
  void (*to_device)(void* device, const void* host, std::size_t bytes, void* stream);
};

std::unique_ptr<DeviceGroup> make_staged_group(Communicator& host, StagingCopies copies);

}  // namespace dlm::train
