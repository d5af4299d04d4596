// dlm's MPI communicator (polled non-blocking operations under a deadline, mpi_communicator.cpp) beside MPI's own
// blocking collectives on the same buffers: an all-gather then an all-reduce of N floats per rank, the pair the
// staged device groups run for every tensor/sequence-parallel activation. Rank 0 prints one line per size with both
// times and their ratio (dlm / MPI; 1.0 is the peer's speed).
//
// usage: mpirun -np 2 mpi_collective_bench [--repeats 20]
// To see the shared-memory transport's effect: --mca btl_vader_single_copy_mechanism none (fragments through
// shared memory, as where CMA is refused) against the default.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dlm/train/mpi_communicator.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double seconds_per_pair(int repeats, F pair) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  for (int i = 0; i < repeats; ++i) pair();
  double s = std::chrono::duration<double>(Clock::now() - t0).count() / repeats;
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  dlm::train::MpiSession session(&argc, &argv);
  int repeats = 20;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::stoi(argv[i + 1]);
  auto world = dlm::train::mpi_world_communicator(600);
  const int ranks = world->size();
  for (const std::size_t n : {std::size_t{1} << 16, std::size_t{1} << 20, std::size_t{4} << 20}) {
    std::vector<float> in(n, 1.0f), out(n * static_cast<std::size_t>(ranks)), sums(n, 1.0f);
    const double dlm = seconds_per_pair(repeats, [&] {
      world->all_gather(std::span<const float>(in), std::span<float>(out));
      world->all_reduce(std::span<float>(sums));
    });
    const double mpi = seconds_per_pair(repeats, [&] {
      MPI_Allgather(in.data(), static_cast<int>(n), MPI_FLOAT, out.data(), static_cast<int>(n), MPI_FLOAT,
                    MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    if (world->rank() == 0)
      std::printf("%d ranks, %zu floats: dlm %.3f ms, MPI blocking %.3f ms per all-gather + all-reduce, ratio %.2f\n",
                  ranks, n, dlm * 1e3, mpi * 1e3, dlm / mpi);
  }
  return 0;
}
