// The NCCL data-parallel group of dlm-train's GPU runs (device_groups.h); no NCCL in the build: one line.
#include "dlm/train/device_groups.h"

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/device_group.h"
#ifdef DLM_HAVE_NCCL
#include "dlm/train/nccl_communicator.h"
#endif

namespace dlm::train {

DeviceGroups make_device_groups(Communicator& mpi_world, const ParallelConfig& config, int local_rank,
                                double timeout_seconds, const std::shared_ptr<TcpStore>& store) {
#ifdef DLM_HAVE_NCCL
  DeviceGroups g;
  auto world = nccl_world_communicator(mpi_world, local_rank, timeout_seconds, store);
  const int rank = mpi_world.rank();
  g.data = split_group(*world, data_parallel_ranks(config, rank), "NCCL data-parallel");
  if (config.data > 1) g.data_group = nccl_device_group(*g.data);
  if (config.tensor > 1) {
    g.tensor = split_group(*world, tensor_parallel_ranks(config, rank), "NCCL tensor-parallel");
    g.tensor_group = nccl_device_group(*g.tensor);
  }
  if (config.pipeline > 1) {
    g.pipeline = split_group(*world, pipeline_parallel_ranks(config, rank), "NCCL pipeline-parallel");
    g.pipeline_group = nccl_device_group(*g.pipeline);
  }
  if (config.expert > 1) {
    g.expert = split_group(*world, expert_parallel_ranks(config, rank), "NCCL expert-parallel");
    g.expert_group = nccl_device_group(*g.expert);
    g.expert_data = split_group(*world, expert_data_parallel_ranks(config, rank), "NCCL expert-data-parallel");
    g.expert_data_group = nccl_device_group(*g.expert_data);
  }
  g.world = std::move(world);
  return g;
#else
  (void)mpi_world, (void)config, (void)local_rank, (void)timeout_seconds, (void)store;
  fail("--device cuda on several ranks needs NCCL, and this build of dlm has none (see docs/cuda.md; or --device cpu)");
#endif
}

DeviceGroups staged_device_groups(const ProcessGroups& groups) {
  DeviceGroups g;
  // No device communicator (data): the trainer's own all-reduce is unavailable, so data parallelism runs only
  // where the model reduces its gradients over data_group (the distributed optimizer, the overlapped
  // reduction); the trainer says so in one line otherwise.
  if (groups.config.data > 1) g.data_group = staged_device_group(*groups.data);
  if (groups.config.tensor > 1) g.tensor_group = staged_device_group(*groups.tensor);
  if (groups.config.pipeline > 1) g.pipeline_group = staged_device_group(*groups.pipeline);
  if (groups.config.expert > 1) {
    g.expert_group = staged_device_group(*groups.expert);
    g.expert_data_group = staged_device_group(*groups.expert_data);
  }
  return g;
}

std::size_t device_element_size(DeviceElement type) { return type == DeviceElement::kBF16 ? 2 : 4; }  // kF32, kI32: 4

#ifndef DLM_HAVE_NCCL
std::unique_ptr<DeviceGroup> nccl_device_group(Communicator& nccl) {
  fail(fmt::format("{}: this build of dlm has no NCCL", nccl.name()));
}
#endif

void run_on_stream(Communicator& device_group, void* stream) {
#ifdef DLM_HAVE_NCCL
  if (auto* nccl = dynamic_cast<NcclCommunicator*>(&device_group)) nccl->use_stream(stream);
#else
  (void)device_group, (void)stream;
#endif
}

}  // namespace dlm::train
