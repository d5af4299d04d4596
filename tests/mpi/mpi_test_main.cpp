#include "mpi_test_main.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "dlm/common/log.h"
#include "dlm/train/mpi_communicator.h"
#include "dlm/train/torchrun.h"

namespace dlm::test {
namespace {
std::unique_ptr<train::Communicator> g_world;
std::shared_ptr<train::TcpStore> g_store;

// On ranks other than 0 the default printer is gone; this prints each failed assertion with the rank.
// The test's name is kept from OnTestStart: gtest reports a part result with its own lock held, so asking
// it for the current test there would deadlock.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::printf("[rank %d] %s failed at %s:%d\n%s\n", rank_, test_.c_str(),
                result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
    std::fflush(stdout);
  }

 private:
  int rank_;
  std::string test_;
};
}  // namespace

train::Communicator& mpi_world() { return *g_world; }
std::shared_ptr<train::TcpStore> torchrun_store() { return g_store; }

}  // namespace dlm::test

int main(int argc, char** argv) {
  // Under torchrun the same tests run over Gloo (torchrun.h), MPI untouched.
  const auto launch = dlm::train::launch_info_from_environment();
  std::optional<dlm::train::MpiSession> mpi;
  dlm::train::TorchrunWorld torchrun;
  // A rank that fails an assertion and skips a collective makes the others name it within this timeout.
  if (launch.launcher == "torchrun") {
    torchrun = dlm::train::join_torchrun(launch, 120.0);
    dlm::test::g_world = std::move(torchrun.world);
    dlm::test::g_store = torchrun.store;
  } else {
    mpi.emplace(&argc, &argv);
    dlm::test::g_world = dlm::train::mpi_world_communicator(120.0);
  }
  ::testing::InitGoogleTest(&argc, argv);
  dlm::log::set_level(dlm::log::Level::kWarning);  // the trainers' iteration lines of 4 ranks would bury the results
  const int rank = dlm::test::g_world->rank();
  if (rank != 0) {
    // Rank 0 prints the run; the others print only their failures, each marked with its rank.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new dlm::test::FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  dlm::test::g_world->all_reduce(std::span<int>(&failed, 1), dlm::train::ReduceOp::kMax);
  if (rank == 0) std::printf("%s on %d ranks\n", failed ? "MPI TESTS FAILED" : "mpi tests passed", dlm::test::g_world->size());
  dlm::test::g_world.reset();
  dlm::test::g_store.reset();
  return failed;
}
