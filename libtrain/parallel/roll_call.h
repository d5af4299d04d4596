// The watchdog behind the communicators (MPI's, NCCL's, Gloo's): a roll call that names the rank a missed
// deadline is waiting for. A live member answers pings with the number of operations it has entered; one
// whose operation missed its deadline pings the members of its group and names those that stay silent until
// the timeout is over. When every member answers (a member is itself stuck behind a rank outside the group,
// as a tensor-parallel peer is behind a lost pipeline stage), it goes on to the rest of the world, so the lost
// rank is still the one named.
//
// Two transports: MPI (a duplicate of MPI_COMM_WORLD of its own; a rank answers from the polling loop of the
// operation it waits in, so one busy computing through the whole roll call is named too), and the c10d store
// of torchrun's ranks (a thread of each rank answers through a connection of its own every 100 ms, so a live
// rank answers wherever it is; the operation count it gives says where).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dlm::train {

class RollCall {
 public:
  using Clock = std::chrono::steady_clock;
  RollCall(double timeout_seconds, int world_rank, int world_size);  // dlm::Error unless the timeout is positive
  virtual ~RollCall() = default;
  RollCall(const RollCall&) = delete;
  RollCall& operator=(const RollCall&) = delete;

  double timeout_seconds() const { return timeout_seconds_; }
  int world_rank() const { return world_rank_; }
  // Counts the operations this process has entered (the number a live member answers with).
  long long next_operation() { return ++operations_; }
  // Answers every ping waiting for this process (MPI; the store's thread answers by itself).
  virtual void answer() {}
  // Pings every member of `members` (world ranks) but this process and waits for their answers until
  // `deadline`: "rank 2 did not answer (dead or hung)"; when every member answered, where each was and
  // the ranks outside the group that did not answer either ("...; outside the group, rank 5 did not
  // answer (dead or hung)"), or that none was lost ("the ranks did not call the same collectives").
  std::string verdict(const std::vector<int>& members, Clock::time_point deadline);

 protected:
  // The world ranks of `ranks` (this process left out) that answered by `deadline`, with their counts.
  virtual std::map<int, long long> ping(const std::vector<int>& ranks, Clock::time_point deadline) = 0;
  std::atomic<long long> operations_{0};

 private:
  int world_rank_ = 0, world_size_ = 1;
  double timeout_seconds_ = 600;
};

// Collective over the MPI world (MPI_Comm_dup); MPI must be initialized.
std::shared_ptr<RollCall> mpi_roll_call(double timeout_seconds);
// Over the c10d store at host:port (two connections of its own, keys under `prefix`); not collective.
std::shared_ptr<RollCall> store_roll_call(const std::string& host, int port, const std::string& prefix, int world_rank,
                                          int world_size, double timeout_seconds);

}  // namespace dlm::train
