// The roll call of the NCCL communicators over MPI (see nccl_roll_call.h).
#include "nccl_roll_call.h"

#include <map>
#include <thread>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train::nccl {
namespace {
constexpr int kPing = 7101, kPong = 7102;
}

RollCall::RollCall(double timeout_seconds) : timeout_seconds_(timeout_seconds) {
  if (!(timeout_seconds > 0)) fail("--distributed-timeout-minutes must be positive");
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  if (MPI_Comm_dup(MPI_COMM_WORLD, &comm_) != MPI_SUCCESS) fail("NCCL start-up: MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

RollCall::~RollCall() {
  // Unanswered pings may be pending after a failure; freeing marks the communicator for deallocation.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void RollCall::answer() {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kPing, comm_, &flag, &status) != MPI_SUCCESS || !flag) return;
    long long asked = 0;
    MPI_Recv(&asked, 1, MPI_LONG_LONG, status.MPI_SOURCE, kPing, comm_, MPI_STATUS_IGNORE);
    replies_.push_back(operations_);
    if (replies_.size() > 4096) replies_.pop_front();
    MPI_Request request;
    // Small and eager: completes locally, never waited on.
    if (MPI_Isend(&replies_.back(), 1, MPI_LONG_LONG, status.MPI_SOURCE, kPong, comm_, &request) == MPI_SUCCESS)
      MPI_Request_free(&request);
  }
}

std::string RollCall::verdict(const std::vector<int>& members, Clock::time_point deadline) {
  replies_.push_back(operations_);
  const long long& mine = replies_.back();
  int others = 0;
  for (int r : members) {
    if (r == world_rank_) continue;
    ++others;
    MPI_Request request;
    if (MPI_Isend(&mine, 1, MPI_LONG_LONG, r, kPing, comm_, &request) == MPI_SUCCESS) MPI_Request_free(&request);
  }
  std::map<int, long long> answers;  // world rank -> the operation it was in
  while (static_cast<int>(answers.size()) < others && Clock::now() < deadline) {
    answer();
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kPong, comm_, &flag, &status) == MPI_SUCCESS && flag) {
      long long theirs = 0;
      MPI_Recv(&theirs, 1, MPI_LONG_LONG, status.MPI_SOURCE, kPong, comm_, MPI_STATUS_IGNORE);
      answers[status.MPI_SOURCE] = theirs;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::string lost, where;
  int lost_count = 0;
  for (int r : members) {
    if (r == world_rank_) continue;
    if (auto it = answers.find(r); it != answers.end())
      where += fmt::format("{}rank {} at operation #{}", where.empty() ? "" : ", ", r, it->second);
    else
      lost += fmt::format("{}{}", lost_count++ ? ", " : "", r);
  }
  if (lost_count == 0)
    return fmt::format("every member answered ({}): the ranks did not call the same collectives", where);
  return fmt::format("{} {} did not answer (dead or hung)", lost_count == 1 ? "rank" : "ranks", lost);
}

}  // namespace dlm::train::nccl
