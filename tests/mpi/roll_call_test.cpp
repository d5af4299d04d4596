// The roll call names a lost rank outside the group that timed out (mpiexec -n 4, one scenario per job,
// so it is its own program). Rank 3 hangs without answering; rank 1 waits on it in a group {1, 3}; rank 2
// waits on it in {2, 3}; rank 0 waits in {0, 1} for rank 1, which never comes. Rank 0's group times out
// first, rank 1 answers its ping (alive, stuck behind rank 3), and the error must still name rank 3. Each
// rank prints its error; CTest matches rank 0's line. The ranks leave with _exit (their MPI requests are
// abandoned after a timeout, so MPI_Finalize could wait on them).
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "dlm/train/communicator.h"
#include "dlm/train/mpi_communicator.h"

int main(int argc, char** argv) {
  dlm::train::MpiSession mpi(&argc, &argv);
  constexpr double kTimeout = 3.0;  // rank 0's, seconds
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Ranks 1 and 2 wait twice as long, so they are still answering pings when rank 0 calls the roll,
  // however the ranks' starts are skewed (a rank that has given up answers nobody, and would be named too).
  auto world = dlm::train::mpi_world_communicator(rank == 0 ? kTimeout : 2 * kTimeout);
  if (world->size() != 4) {
    if (rank == 0) std::printf("roll call test: needs 4 ranks, has %d\n", world->size());
    std::fflush(stdout);
    _exit(1);
  }
  // Groups {0, 1} and {2, 3}, and {1, 3} (0 and 2 alone in theirs).
  auto pairs = world->split(rank / 2, rank, "group of ranks 0-1 / 2-3");
  auto odd = world->split(rank % 2, rank, "group of ranks 1, 3 / 0, 2");
  world->barrier();
  std::string message = "no error";
  try {
    if (rank == 3) {
      std::this_thread::sleep_for(std::chrono::duration<double>(3 * kTimeout));  // hung: answers nobody
      _exit(0);
    }
    std::vector<float> value(1, 1.0f);
    if (rank == 0) pairs->all_reduce(std::span<float>(value));  // rank 1 never joins
    if (rank == 1) odd->all_reduce(std::span<float>(value));    // with rank 3
    if (rank == 2) pairs->all_reduce(std::span<float>(value));  // with rank 3
  } catch (const dlm::train::CommunicationError& e) {
    message = e.what();
  }
  std::printf("[rank %d] %s\n", rank, message.c_str());
  std::fflush(stdout);
  // Rank 0 waits for the others' lines to be written (they time out a few seconds later).
  if (rank == 0) std::this_thread::sleep_for(std::chrono::duration<double>(1.5 * kTimeout));
  _exit(0);
}
