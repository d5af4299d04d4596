// The watchdog behind the communicators (MPI's and NCCL's): a roll call over MPI on a duplicate of
// MPI_COMM_WORLD of its own. A rank waiting in an operation answers pings from its polling loop with the
// number of operations it has entered; one whose operation missed its deadline pings the members of its
// group and names those that stay silent until the timeout is over. When every member answers (a member is
// itself stuck behind a rank outside the group, as a tensor-parallel peer is behind a lost pipeline
// stage), it goes on to the rest of the world, so the lost rank is still the one named.
#pragma once

#include <mpi.h>

#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace dlm::train {

class RollCall {
 public:
  using Clock = std::chrono::steady_clock;
  // Collective over the MPI world (MPI_Comm_dup).
  explicit RollCall(double timeout_seconds);
  ~RollCall();
  RollCall(const RollCall&) = delete;
  RollCall& operator=(const RollCall&) = delete;

  double timeout_seconds() const { return timeout_seconds_; }
  int world_rank() const { return world_rank_; }
  // Counts the operations this process has entered (the number a live member answers with).
  long long next_operation() { return ++operations_; }
  // Answers every ping waiting for this process.
  void answer();
  // Pings every member of `members` (world ranks) but this process and waits for their answers until
  // `deadline`: "rank 2 did not answer (dead or hung)"; when every member answered, where each was and
  // the ranks outside the group that did not answer either ("...; outside the group, rank 5 did not
  // answer (dead or hung)"), or that none was lost ("the ranks did not call the same collectives").
  std::string verdict(const std::vector<int>& members, Clock::time_point deadline);

 private:
  // The world ranks of `ranks` (this process left out) that answered by `deadline`, with their counts.
  std::map<int, long long> ping(const std::vector<int>& ranks, Clock::time_point deadline);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int world_rank_ = 0, world_size_ = 1;
  double timeout_seconds_ = 600;
  long long operations_ = 0;
  std::deque<long long> replies_;  // pongs in flight: MPI keeps pointers to them
};

}  // namespace dlm::train
