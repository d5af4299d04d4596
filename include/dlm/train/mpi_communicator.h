// The MPI implementation of the communicator seam (CPU backend; start-up of the NCCL one).
//
// Every operation is non-blocking MPI polled against a deadline (--distributed-timeout-minutes), so a
// rank that died or hangs never leaves the others waiting forever. When an operation misses its
// deadline (or MPI reports a failed peer), the rank pings every member of the group on a communicator
// of its own; members that are alive answer from whatever collective they are waiting in, and the ones
// that do not answer within the rest of the timeout are named in the CommunicationError:
//   "all_reduce #57 on the data-parallel group (world ranks 0,1,2,3) did not complete within 0.1 min
//    (--distributed-timeout-minutes): rank 2 did not answer (dead or hung)"
// The collective waits 80% of the timeout (at least the timeout less 30 s), the roll call the rest, so
// the error comes within the timeout of the operation's start. A member busy computing (not waiting in
// an operation) for the whole roll call is named too: to the group it is as good as hung.
#pragma once

#include <memory>

#include "dlm/train/communicator.h"

namespace dlm::train {

// MPI_Init / MPI_Finalize for the process's lifetime (MPI_THREAD_FUNNELED: only the main thread calls MPI).
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();  // MPI_Finalize, unless abandon() was called
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  // After a CommunicationError the peers may be gone: MPI_Finalize could wait for them, so it is skipped.
  void abandon() { finalize_ = false; }

 private:
  bool finalize_ = true;
};

// The world as a communicator; the groups split from it share its timeout and roll call.
std::unique_ptr<Communicator> mpi_world_communicator(double timeout_seconds);

}  // namespace dlm::train
