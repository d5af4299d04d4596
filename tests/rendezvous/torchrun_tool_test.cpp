// dlm-train under torchrun as a user launches it (`torchrun --no-python --nproc_per_node 2 dlm-train ...`, the
// ranks' collectives over Gloo, no MPI) against the same command under `mpirun -np 2`: DP2 and TP2 give the same
// per-iteration losses as printed in the metrics file. A store nobody hosts is one line naming
// MASTER_ADDR:MASTER_PORT and the rank; a hung rank is named by the store's roll call. Skipped without torch
// in DLM_PYTHON's environment.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <gtest/gtest.h>

#include "rendezvous_util.h"
#include "tool_fixture.h"

namespace dlm::test {
namespace {

class Torchrun : public ToolTest {
 protected:
  std::vector<std::string> torchrun(const std::vector<std::string>& argv) const {
    std::vector<std::string> a = {DLM_PYTHON, "-m", "torch.distributed.run", "--no-python", "--nproc_per_node", "2"};
    a.insert(a.end(), argv.begin(), argv.end());
    return a;
  }
  std::vector<std::string> mpirun(const std::vector<std::string>& argv) const {
    std::vector<std::string> a = {DLM_MPIEXEC, "-n", "2", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader"};
    a.insert(a.end(), argv.begin(), argv.end());
    return a;
  }
  // The losses of one 6-iteration run of `layout` under `launcher` ("torchrun" or "mpirun").
  std::vector<std::string> losses_under(const std::string& launcher, std::vector<std::string> layout) {
    const auto metrics = dir_ / (launcher + std::to_string(++runs_) + ".jsonl");
    for (const std::string f : {"--train-iters", "6", "--metrics-file"}) layout.push_back(f);
    layout.push_back(metrics.string());
    const auto argv = train_argv(layout);
    const auto r = run(launcher == "torchrun" ? torchrun(argv) : mpirun(argv));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (launcher == "torchrun") EXPECT_NE(r.err.find("2 ranks (torchrun)"), std::string::npos) << r.err;
    return losses(metrics);
  }
  int runs_ = 0;
};

TEST_F(Torchrun, Dp2AndTp2GiveMpirunsLosses) {
  if (!torch_present()) GTEST_SKIP() << "no torch in " << DLM_PYTHON;
  for (const auto& layout : std::vector<std::vector<std::string>>{{}, {"--tensor-model-parallel-size", "2"}}) {
    const auto want = losses_under("mpirun", layout);
    ASSERT_EQ(want.size(), 6u);
    const auto got = losses_under("torchrun", layout);
    EXPECT_EQ(got, want) << (layout.empty() ? "DP2" : "TP2");
    std::string line;
    for (const auto& l : got) line += " " + l;
    std::printf("%s under torchrun:%s\n", layout.empty() ? "DP2" : "TP2", line.c_str());
  }
}

// A rank that hangs (SIGSTOP: its answering thread stops too) is named by the store's roll call within
// --distributed-timeout-minutes.
TEST_F(Torchrun, AHungRankIsNamedThroughTheStore) {
  if (!torch_present()) GTEST_SKIP() << "no torch in " << DLM_PYTHON;
  const std::string tag = "DLM_TEST_TAG=torchrun-" + std::to_string(::getpid());
  const auto metrics = dir_ / "hang.jsonl", err = dir_ / "hang.err";
  auto argv = torchrun(train_argv({"--train-iters", "100000", "--distributed-timeout-minutes", "0.1", "--metrics-file",
                                   metrics.string()}));
  argv.insert(argv.begin(), {"/usr/bin/env", tag});
  const pid_t job = spawn(argv, err.string());
  const auto t0 = std::chrono::steady_clock::now();
  while (losses(metrics).size() < 3 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const pid_t victim = process_with_environment("dlm-train", {tag, "RANK=1"});
  ASSERT_NE(victim, 0) << read_all(err);
  ::kill(victim, SIGSTOP);
  const auto t1 = std::chrono::steady_clock::now();
  double named_after = -1;
  while (std::chrono::steady_clock::now() - t1 < std::chrono::seconds(30)) {
    if (read_all(err).find("did not answer") != std::string::npos) {
      named_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(victim, SIGKILL);
  const auto r = wait_child(job, err.string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_GT(named_after, 0) << r.err;
  EXPECT_LT(named_after, 8.0) << r.err;  // the 6 s timeout, and the answering thread's 100 ms
  EXPECT_NE(r.err.find("dlm-train: rank 0: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did not complete within 0.1 min (--distributed-timeout-minutes): rank 1 did not answer (dead or hung)"),
            std::string::npos) << r.err;
  const auto at = r.err.rfind("dlm-train: rank 0: ");
  std::printf("rank 1 SIGSTOPped under torchrun: named %.1f s later:\n%s\n", named_after,
              at == std::string::npos ? "" : r.err.substr(at, r.err.find('\n', at) - at).c_str());
}

TEST_F(Torchrun, AStoreNobodyHostsIsOneLineNamingTheAddressAndTheRank) {
  const std::string port = std::to_string(closed_port());
  auto argv = train_argv({"--train-iters", "2", "--distributed-timeout-minutes", "0.01"});
  argv.insert(argv.begin(), {"/usr/bin/env", "-u", "OMPI_COMM_WORLD_SIZE", "-u", "SLURM_NTASKS", "-u", "PMI_SIZE",
                             "TORCHELASTIC_RUN_ID=test", "TORCHELASTIC_USE_AGENT_STORE=True", "RANK=1", "WORLD_SIZE=2",
                             "LOCAL_RANK=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port});
  const auto r = run(argv);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(last_error_line(r, "dlm-train"), "dlm-train: rank 1: the c10d store at 127.0.0.1:" + port +
                                                 " (MASTER_ADDR:MASTER_PORT) was not reachable within 0.6 s: Connection refused")
      << r.err;
}

}  // namespace
}  // namespace dlm::test
