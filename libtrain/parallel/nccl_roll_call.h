// The watchdog behind the NCCL communicators: a roll call over MPI, the same protocol the MPI
// communicator holds (mpi_communicator.h), on a duplicate of MPI_COMM_WORLD of its own. A rank waiting in
// an NCCL operation answers pings from its polling loop; one whose operation missed its deadline pings
// the members of its group and names those that stay silent until the timeout is over.
#pragma once

#include <mpi.h>

#include <chrono>
#include <deque>
#include <string>
#include <vector>

namespace dlm::train::nccl {

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
  // `deadline`: "rank 2 did not answer (dead or hung)", or, when every member answered, where each was.
  std::string verdict(const std::vector<int>& members, Clock::time_point deadline);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int world_rank_ = 0;
  double timeout_seconds_ = 600;
  long long operations_ = 0;
  std::deque<long long> replies_;  // pongs in flight: MPI keeps pointers to them
};

}  // namespace dlm::train::nccl
