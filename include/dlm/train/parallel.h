// Process groups of parallel training, with Megatron's rank order and flags.
//
// A world of W ranks is laid out as tensor (fastest), then data, then pipeline:
//   rank = tp_rank + TP * (dp_rank + DP * pp_rank),   DP = W / (TP * PP)
// so the TP ranks of a model replica sit on one node, and a pipeline stage's DP replicas are spread
// with a stride of TP. --tensor-model-parallel-size and --pipeline-model-parallel-size are given;
// the data-parallel size is derived.
//
// Expert parallelism (--expert-model-parallel-size EP, MoE layers) cuts each data-parallel group into EP-rank
// blocks, as megatron-core's expert grid orders "tp-ep-dp-pp" (expert tensor parallelism = TP, no CP):
//   data rank d = ep_rank + EP * expert_data_rank,   EDP = DP / EP
// The EP ranks of one block (consecutive data ranks) exchange tokens by all-to-all and each holds E / EP
// experts; the expert-data-parallel group (stride EP) holds the same experts and sums their gradients.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dlm/train/communicator.h"

namespace dlm::train {

// Where this process sits, as its launcher says: mpirun's OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK},
// srun's SLURM_{PROCID,NTASKS,LOCALID}, MPICH/hydra's PMI_{RANK,SIZE} and MPI_LOCALRANKID; none of
// them: one process. The local rank picks the GPU of a node.
struct LaunchInfo {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string launcher = "none";  // "torchrun" | "mpirun" | "srun" | "hydra" | "none"
};
// Reads the environment through `getenv` (tests pass their own).
LaunchInfo launch_info(const char* (*getenv)(const char*));
LaunchInfo launch_info_from_environment();

struct ParallelConfig {
  int tensor = 1;    // --tensor-model-parallel-size
  int pipeline = 1;  // --pipeline-model-parallel-size
  int data = 1;      // derived: world / (tensor * pipeline)
  int expert = 1;    // --expert-model-parallel-size: divides data
  int world() const { return tensor * pipeline * data; }
  int expert_data() const { return data / expert; }
};
// dlm::Error naming the flags when TP x PP does not divide the world, or EP the data-parallel size.
ParallelConfig derive_parallel_config(int world_size, int tensor, int pipeline, int expert = 1);

struct RankCoords {
  int tensor = 0, data = 0, pipeline = 0;
  bool operator==(const RankCoords&) const = default;
};
// Where data rank `coords.data` sits in the expert grid.
inline int expert_rank(const ParallelConfig& config, const RankCoords& coords) { return coords.data % config.expert; }
inline int expert_data_rank(const ParallelConfig& config, const RankCoords& coords) { return coords.data / config.expert; }
RankCoords rank_coords(const ParallelConfig& config, int rank);
int global_rank(const ParallelConfig& config, RankCoords coords);

// The world ranks of each group `rank` belongs to, in group-rank order.
std::vector<int> tensor_parallel_ranks(const ParallelConfig& config, int rank);
std::vector<int> data_parallel_ranks(const ParallelConfig& config, int rank);
std::vector<int> pipeline_parallel_ranks(const ParallelConfig& config, int rank);
std::vector<int> expert_parallel_ranks(const ParallelConfig& config, int rank);
std::vector<int> expert_data_parallel_ranks(const ParallelConfig& config, int rank);

// The group of `ranks` (one of the lists above, this rank among them) split from `world`, named
// "<what> group (world ranks 0,2,...)" in errors; collective over the world (each rank passes its own).
std::unique_ptr<Communicator> split_group(Communicator& world, const std::vector<int>& ranks, const std::string& what);

// The groups of one rank, split from the world communicator (collective over the world).
struct ProcessGroups {
  ParallelConfig config;
  RankCoords coords;
  std::unique_ptr<Communicator> tensor, data, pipeline;
  // With config.expert > 1 (null otherwise): the expert-parallel and expert-data-parallel groups.
  std::unique_ptr<Communicator> expert, expert_data;
};
ProcessGroups make_process_groups(Communicator& world, const ParallelConfig& config);

}  // namespace dlm::train
