// Megatron's rank order (tensor fastest, then data, then pipeline) and the launcher's rank variables.
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/parallel.h"

namespace dlm::train {
namespace {

int int_variable(const char* (*getenv)(const char*), const char* name) {
  const char* v = getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 24)) fail(fmt::format("{}={}: not a rank or a count", name, v));
  return static_cast<int>(x);
}

std::string join(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

ParallelConfig layout_of(int world_size, int tensor, int pipeline) {
  if (tensor <= 0) fail(fmt::format("--tensor-model-parallel-size {} must be positive", tensor));
  if (pipeline <= 0) fail(fmt::format("--pipeline-model-parallel-size {} must be positive", pipeline));
  if (world_size % (tensor * pipeline) != 0)
    fail(fmt::format("{} ranks are not a multiple of --tensor-model-parallel-size {} x --pipeline-model-parallel-size {}",
                     world_size, tensor, pipeline));
  return ParallelConfig{tensor, pipeline, world_size / (tensor * pipeline)};
}

}  // namespace

LaunchInfo launch_info(const char* (*getenv)(const char*)) {
  struct Scheme {
    const char *launcher, *rank, *size, *local;
  };
  std::vector<Scheme> schemes;
  // torchrun first when it started this process (TORCHELASTIC_RUN_ID): its workers also inherit SLURM_* of an
  // `srun torchrun`. Then mpirun: an mpirun inside a Slurm allocation also sees SLURM_* of the allocation.
  if (const char* run_id = getenv("TORCHELASTIC_RUN_ID"); run_id && *run_id)
    schemes.push_back({"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"});
  schemes.push_back({"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"});
  schemes.push_back({"hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"});
  schemes.push_back({"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"});
  for (const Scheme& s : schemes) {
    const int rank = int_variable(getenv, s.rank), size = int_variable(getenv, s.size);
    if (rank < 0 || size < 0) continue;
    if (size == 0 || rank >= size) fail(fmt::format("{}={} and {}={} do not make a rank", s.rank, rank, s.size, size));
    const int local = int_variable(getenv, s.local);
    return LaunchInfo{rank, size, local < 0 ? 0 : local, s.launcher};
  }
  return {};
}

LaunchInfo launch_info_from_environment() {
  return launch_info([](const char* name) -> const char* { return std::getenv(name); });
}

ParallelConfig derive_parallel_config(int world_size, int tensor, int pipeline, int expert) {
  ParallelConfig c = layout_of(world_size, tensor, pipeline);
  if (expert <= 0) fail(fmt::format("--expert-model-parallel-size {} must be positive", expert));
  if (c.data % expert != 0)
    fail(fmt::format("--expert-model-parallel-size {} does not divide the data-parallel size {} ({} ranks / TP {} x PP {})",
                     expert, c.data, world_size, tensor, pipeline));
  c.expert = expert;
  return c;
}

RankCoords rank_coords(const ParallelConfig& c, int rank) {
  if (rank < 0 || rank >= c.world()) fail(fmt::format("rank {} is outside the world of {}", rank, c.world()));
  return RankCoords{rank % c.tensor, rank / c.tensor % c.data, rank / (c.tensor * c.data)};
}

int global_rank(const ParallelConfig& c, RankCoords x) { return x.tensor + c.tensor * (x.data + c.data * x.pipeline); }

std::vector<int> tensor_parallel_ranks(const ParallelConfig& c, int rank) {
  RankCoords x = rank_coords(c, rank);
  std::vector<int> out;
  for (x.tensor = 0; x.tensor < c.tensor; ++x.tensor) out.push_back(global_rank(c, x));
  return out;
}

std::vector<int> data_parallel_ranks(const ParallelConfig& c, int rank) {
  RankCoords x = rank_coords(c, rank);
  std::vector<int> out;
  for (x.data = 0; x.data < c.data; ++x.data) out.push_back(global_rank(c, x));
  return out;
}

std::vector<int> pipeline_parallel_ranks(const ParallelConfig& c, int rank) {
  RankCoords x = rank_coords(c, rank);
  std::vector<int> out;
  for (x.pipeline = 0; x.pipeline < c.pipeline; ++x.pipeline) out.push_back(global_rank(c, x));
  return out;
}

std::vector<int> expert_parallel_ranks(const ParallelConfig& c, int rank) {
  RankCoords x = rank_coords(c, rank);
  const int first = x.data - expert_rank(c, x);
  std::vector<int> out;
  for (x.data = first; x.data < first + c.expert; ++x.data) out.push_back(global_rank(c, x));
  return out;
}

std::vector<int> expert_data_parallel_ranks(const ParallelConfig& c, int rank) {
  RankCoords x = rank_coords(c, rank);
  std::vector<int> out;
  for (x.data = expert_rank(c, x); x.data < c.data; x.data += c.expert) out.push_back(global_rank(c, x));
  return out;
}

std::unique_ptr<Communicator> split_group(Communicator& world, const std::vector<int>& ranks, const std::string& what) {
  // A group's color is its first member: unique per group, the same for all of its members.
  return world.split(ranks.front(), world.rank(), fmt::format("{} group (world ranks {})", what, join(ranks)));
}

ProcessGroups make_process_groups(Communicator& world, const ParallelConfig& config) {
  if (world.size() != config.world())
    fail(fmt::format("the launcher started {} ranks, the layout needs {}", world.size(), config.world()));
  ProcessGroups g;
  g.config = config;
  const int rank = world.rank();
  g.coords = rank_coords(config, rank);
  g.tensor = split_group(world, tensor_parallel_ranks(config, rank), "tensor-parallel");
  g.data = split_group(world, data_parallel_ranks(config, rank), "data-parallel");
  g.pipeline = split_group(world, pipeline_parallel_ranks(config, rank), "pipeline-parallel");
  if (config.expert > 1) {
    g.expert = split_group(world, expert_parallel_ranks(config, rank), "expert-parallel");
    g.expert_data = split_group(world, expert_data_parallel_ranks(config, rank), "expert-data-parallel");
  }
  return g;
}

}  // namespace dlm::train
