// The communicators' roll call: the verdict shared by its transports, and the MPI transport (see roll_call.h).
#include "roll_call.h"

#include <mpi.h>

#include <algorithm>
#include <deque>
#include <thread>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train {
namespace {
constexpr int kPing = 7101, kPong = 7102;

class MpiRollCall final : public RollCall {
 public:
  MpiRollCall(double timeout_seconds, int rank, int size) : RollCall(timeout_seconds, rank, size) {
    if (MPI_Comm_dup(MPI_COMM_WORLD, &comm_) != MPI_SUCCESS) fail("the roll call's MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiRollCall() override {
    // Unanswered pings may be pending after a failure; freeing marks the communicator for deallocation.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }
  void answer() override;

 protected:
  std::map<int, long long> ping(const std::vector<int>& ranks, Clock::time_point deadline) override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::deque<long long> replies_;  // pongs in flight: MPI keeps pointers to them
};

}  // namespace

RollCall::RollCall(double timeout_seconds, int world_rank, int world_size)
    : world_rank_(world_rank), world_size_(world_size), timeout_seconds_(timeout_seconds) {
  if (!(timeout_seconds > 0)) fail("--distributed-timeout-minutes must be positive");
}

std::shared_ptr<RollCall> mpi_roll_call(double timeout_seconds) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::make_shared<MpiRollCall>(timeout_seconds, rank, size);
}

void MpiRollCall::answer() {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kPing, comm_, &flag, &status) != MPI_SUCCESS || !flag) return;
    long long asked = 0;
    MPI_Recv(&asked, 1, MPI_LONG_LONG, status.MPI_SOURCE, kPing, comm_, MPI_STATUS_IGNORE);
    replies_.push_back(operations_.load());
    if (replies_.size() > 4096) replies_.pop_front();
    MPI_Request request;
    // Small and eager: completes locally, never waited on.
    if (MPI_Isend(&replies_.back(), 1, MPI_LONG_LONG, status.MPI_SOURCE, kPong, comm_, &request) == MPI_SUCCESS)
      MPI_Request_free(&request);
  }
}

std::map<int, long long> MpiRollCall::ping(const std::vector<int>& ranks, Clock::time_point deadline) {
  replies_.push_back(operations_.load());
  const long long& mine = replies_.back();
  int others = 0;
  for (int r : ranks) {
    if (r == world_rank()) continue;
    ++others;
    MPI_Request request;
    if (MPI_Isend(&mine, 1, MPI_LONG_LONG, r, kPing, comm_, &request) == MPI_SUCCESS) MPI_Request_free(&request);
  }
  // Alive ranks answer within milliseconds from their polling loops; a late pong of an earlier roll call
  // from a rank not asked now is dropped.
  std::map<int, long long> answers;
  const auto asked = [&](int r) { return std::find(ranks.begin(), ranks.end(), r) != ranks.end(); };
  while (static_cast<int>(answers.size()) < others && Clock::now() < deadline) {
    answer();
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kPong, comm_, &flag, &status) == MPI_SUCCESS && flag) {
      long long theirs = 0;
      MPI_Recv(&theirs, 1, MPI_LONG_LONG, status.MPI_SOURCE, kPong, comm_, MPI_STATUS_IGNORE);
      if (asked(status.MPI_SOURCE)) answers[status.MPI_SOURCE] = theirs;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return answers;
}

namespace {
// "rank 3" / "ranks 3, 5" of `ranks` (this process left out) missing from `answers`; empty when none is.
std::string silent(const std::vector<int>& ranks, int self, const std::map<int, long long>& answers) {
  std::string names;
  int count = 0;
  for (int r : ranks)
    if (r != self && !answers.count(r)) names += fmt::format("{}{}", count++ ? ", " : "", r);
  if (count == 0) return {};
  return fmt::format("{} {} did not answer (dead or hung)", count == 1 ? "rank" : "ranks", names);
}
}  // namespace

std::string RollCall::verdict(const std::vector<int>& members, Clock::time_point deadline) {
  const auto answers = ping(members, deadline);
  if (std::string lost = silent(members, world_rank_, answers); !lost.empty()) return lost;
  std::string where;
  for (const auto& [r, op] : answers) where += fmt::format("{}rank {} at operation #{}", where.empty() ? "" : ", ", r, op);
  // Every member is alive: one of them may wait on a rank outside the group. Ask the rest of the world.
  std::vector<int> rest;
  for (int r = 0; r < world_size_; ++r)
    if (r != world_rank_ && std::find(members.begin(), members.end(), r) == members.end()) rest.push_back(r);
  if (!rest.empty())
    if (std::string lost = silent(rest, world_rank_, ping(rest, deadline)); !lost.empty())
      return fmt::format("every member answered ({}); outside the group, {}", where, lost);
  return fmt::format("every member answered ({}): the ranks did not call the same collectives", where);
}

}  // namespace dlm::train
