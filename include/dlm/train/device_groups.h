// dlm-train's groups over GPU memory: with --device cuda under mpirun/srun, each rank's model lives on the
// GPU of its local rank; the gradients are summed in device memory (NCCL) and, under TP/PP, the layers'
// collectives and the pipeline's transfers go through NCCL too, while the host scalars (loss, stop flags,
// the norm) keep going through the MPI groups of parallel.h.
#pragma once

#include <memory>

#include "dlm/train/communicator.h"
#include "dlm/train/device_group.h"
#include "dlm/train/parallel.h"

namespace dlm::train {

class TcpStore;

struct DeviceGroups {
  std::unique_ptr<Communicator> world;  // the NCCL world the groups are split from
  std::unique_ptr<Communicator> data;   // this rank's data-parallel group, device memory
  // With TP or PP: those groups, and their enqueue-only views for the model's layers (device_group.h).
  std::unique_ptr<Communicator> tensor, pipeline;
  std::unique_ptr<DeviceGroup> tensor_group, pipeline_group;
  // With several data-parallel ranks: the data group's view, for the GPU's distributed optimizer.
  std::unique_ptr<DeviceGroup> data_group;
  // With expert parallelism (config.expert > 1): the expert-parallel group (the MoE layers' token all-to-alls)
  // and the expert-data-parallel group (the experts' gradient sums), and their views.
  std::unique_ptr<Communicator> expert, expert_data;
  std::unique_ptr<DeviceGroup> expert_group, expert_data_group;
};

// Collective over `mpi_world`: takes GPU `local_rank`, makes the NCCL world and splits its data-parallel
// group (and tensor, pipeline, expert and expert-data groups when they have several members, or with expert
// parallelism) with Megatron's rank order.
// A dlm::Error of one line when this build has no NCCL.
// Under torchrun `mpi_world` is the Gloo world and `store` torchrun's c10d store (the NCCL id and the roll
// call go through it; nccl_communicator.h).
DeviceGroups make_device_groups(Communicator& mpi_world, const ParallelConfig& config, int local_rank,
                                double timeout_seconds, const std::shared_ptr<TcpStore>& store = nullptr);
// For tests on one GPU (dlm-train --device-groups staged): the tensor, pipeline, data and expert groups staged
// through host memory over `groups`' MPI groups, so several ranks may share a GPU, which NCCL refuses. Slow.
// No device communicator for the trainer's own data-parallel all-reduce: DP > 1 runs only with a model that
// reduces its gradients itself (--use-distributed-optimizer, --overlap-grad-reduce). `groups` must outlive
// the result.
DeviceGroups staged_device_groups(const ProcessGroups& groups);
// Puts the group's work on `stream` (the model's cudaStream_t), behind the kernels that produce its data.
void run_on_stream(Communicator& device_group, void* stream);

}  // namespace dlm::train
