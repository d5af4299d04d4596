// dlm-train's data-parallel group over GPU memory: with --device cuda under mpirun/srun, each rank's model
// lives on the GPU of its local rank and the gradients are summed in device memory (NCCL), while the
// host scalars (loss, stop flags) keep going through the MPI groups of parallel.h.
#pragma once

#include <memory>

#include "dlm/train/communicator.h"
#include "dlm/train/parallel.h"

namespace dlm::train {

struct DeviceGroups {
  std::unique_ptr<Communicator> world;  // the NCCL world the groups are split from
  std::unique_ptr<Communicator> data;   // this rank's data-parallel group, device memory
};

// Collective over `mpi_world`: takes GPU `local_rank`, makes the NCCL world and splits its data-parallel
// group with Megatron's rank order. A dlm::Error of one line when this build has no NCCL.
DeviceGroups make_device_groups(Communicator& mpi_world, const ParallelConfig& config, int local_rank,
                                double timeout_seconds);
// Puts the group's work on `stream` (the model's cudaStream_t), behind the kernels that produce its data.
void run_on_stream(Communicator& device_group, void* stream);

}  // namespace dlm::train
