// The NCCL data-parallel group of dlm-train's GPU runs (device_groups.h); no NCCL in the build: one line.
#include "dlm/train/device_groups.h"

#include "dlm/common/error.h"
#ifdef DLM_HAVE_NCCL
#include "dlm/train/nccl_communicator.h"
#endif

namespace dlm::train {

DeviceGroups make_device_groups(Communicator& mpi_world, const ParallelConfig& config, int local_rank,
                                double timeout_seconds) {
#ifdef DLM_HAVE_NCCL
  DeviceGroups g;
  auto world = nccl_world_communicator(mpi_world, local_rank, timeout_seconds);
  g.data = split_group(*world, data_parallel_ranks(config, mpi_world.rank()), "NCCL data-parallel");
  g.world = std::move(world);
  return g;
#else
  (void)mpi_world, (void)config, (void)local_rank, (void)timeout_seconds;
  fail("--device cuda on several ranks needs NCCL, and this build of dlm has none (see docs/cuda.md; or --device cpu)");
#endif
}

void run_on_stream(Communicator& device_group, void* stream) {
#ifdef DLM_HAVE_NCCL
  if (auto* nccl = dynamic_cast<NcclCommunicator*>(&device_group)) nccl->use_stream(stream);
#else
  (void)device_group, (void)stream;
#endif
}

}  // namespace dlm::train
