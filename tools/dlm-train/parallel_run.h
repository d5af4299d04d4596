// dlm-train's parallel side: the launcher's ranks, MPI (or torchrun's store and Gloo) and the process groups, the rank-0-first set-up,
// and the dry run's plan (docs/parallelism.md).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dlm/train/device_groups.h"
#include "dlm/train/mpi_communicator.h"
#include "dlm/train/parallel.h"
#include "dlm/train/torchrun.h"
#include "pipeline.h"
#include "train_args.h"

namespace dlm::tools {

struct ParallelRun {
  train::LaunchInfo launch;
  std::unique_ptr<train::MpiSession> mpi;     // declared first: finalized after the groups are freed
  std::shared_ptr<train::TcpStore> store;      // under torchrun: its agent's c10d store (MPI is not started)
  std::unique_ptr<train::Communicator> world;  // none on one process
  std::optional<train::ProcessGroups> groups;
  train::DeviceGroups device;  // --device cuda on several ranks: the NCCL data-parallel group
  train::Communicator* device_data_parallel() const { return device.data.get(); }
  bool distributed() const { return world != nullptr; }
  train::Communicator* data_parallel() const { return groups ? groups->data.get() : nullptr; }
};

// Checks the layout flags (a one-line error before MPI starts), then starts MPI (under torchrun: joins its
// store and Gloo) when the launcher started more than one rank and splits the tensor, data and pipeline groups.
ParallelRun start_parallel(const TrainArgs& args, int* argc, char*** argv);

// Rank 0 prepares first (it builds the data's index caches), the others after its verdict: a bad input
// stops every rank with one message instead of each one racing to build the same files.
TrainingSetup prepare_on_every_rank(TrainArgs& args, ParallelRun& run);

// The --dry-run table for the flags' model and layout; nothing is allocated and no data is read.
std::string dry_run_plan(TrainArgs& args);

}  // namespace dlm::tools
