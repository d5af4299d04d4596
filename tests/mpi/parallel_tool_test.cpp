// dlm-train under mpiexec -n 4 as a user runs it: DP4, TP2xPP2, TP2xDP2 and interleaved PP2xDP2 give the
// single-process losses; DP4 gives the single-process losses and its
// checkpoint resumes on one process; a rank SIGKILLed or stopped mid-run makes the job exit non-zero
// within --distributed-timeout-minutes with a message naming it; layout flags are checked up front.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "tool_fixture.h"

namespace fs = std::filesystem;

namespace dlm::test {
namespace {

using Clock = std::chrono::steady_clock;

class ParallelTool : public ToolTest {
 protected:
  void SetUp() override {
    ToolTest::SetUp();
    tag_ = "dlm-parallel-tool-" + std::to_string(::getpid());
  }
  // mpiexec -n 4 (or `ranks`) over `argv`; its ranks carry DLM_TEST_TAG (how rank_pid finds them) in their environment.
  std::vector<std::string> mpi(std::vector<std::string> argv, std::vector<std::string> mpiexec_flags = {},
                               int ranks = 4) const {
    std::vector<std::string> a = {DLM_MPIEXEC, "-n", std::to_string(ranks), "--oversubscribe", "--allow-run-as-root",
                                  "-x", "DLM_TEST_TAG=" + tag_};
    a.insert(a.end(), mpiexec_flags.begin(), mpiexec_flags.end());
    a.insert(a.end(), argv.begin(), argv.end());
    return a;
  }
  // dlm-train's argv: `common` (ending in --metrics-file), then the metrics file and a layout's flags.
  std::vector<std::string> layout_argv(std::vector<std::string> common, const fs::path& metrics,
                                       const std::vector<std::string>& layout) const {
    common.push_back(metrics.string());
    common.insert(common.end(), layout.begin(), layout.end());
    return train_argv(common);
  }
  // The pid of dlm-train's rank `rank` of this test's job (0 while it has not started).
  pid_t rank_pid(int rank) const {
    return process_with_environment("dlm-train", {"DLM_TEST_TAG=" + tag_, "OMPI_COMM_WORLD_RANK=" + std::to_string(rank)});
  }

  // Starts a long DP4 run, waits for its third logged iteration, sends `sig` to rank `victim` and
  // returns the job's result and the seconds from the signal to the job's end.
  std::pair<ChildResult, double> signal_mid_run(int sig, int victim, std::vector<std::string> mpiexec_flags = {},
                                                std::string wrapper = "", std::vector<std::string> flags = {}) {
    const auto metrics = dir_ / "kill.jsonl";
    for (const std::string f : {"--train-iters", "100000", "--global-batch-size", "8", "--distributed-timeout-minutes",
                                "0.1", "--metrics-file"})
      flags.push_back(f);
    flags.push_back(metrics.string());
    auto argv = train_argv(flags);
    if (!wrapper.empty()) argv.insert(argv.begin(), {"/bin/sh", "-c", wrapper});  // $0 is dlm-train
    const std::string err = (dir_ / "err").string();
    const pid_t job = spawn(mpi(argv, mpiexec_flags), err);
    const auto t0 = Clock::now();
    while (losses(metrics).size() < 3 && Clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const pid_t pid = rank_pid(victim);
    EXPECT_NE(pid, 0) << read_all(err);
    if (pid) ::kill(pid, sig);
    const auto t1 = Clock::now();
    auto r = wait_child(job, err);
    const double seconds = std::chrono::duration<double>(Clock::now() - t1).count();
    if (pid && sig == SIGSTOP) ::kill(pid, SIGKILL);  // the launcher may leave a stopped process behind
    return {r, seconds};
  }
  // The single process's losses of the MoE model of kMoeFlags.
  std::vector<double> moe_single_losses() const;
  std::string tag_;
};

// A mixture-of-experts model with aux and z losses on (their gradients shape the later losses); ends in --metrics-file.
const std::vector<std::string> kMoeFlags = {"--num-layers", "4", "--train-iters", "6", "--global-batch-size", "8",
                                            "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16",
                                            "--moe-layer-freq", "2", "--moe-aux-loss-coeff", "0.1", "--moe-z-loss-coeff",
                                            "0.01", "--metrics-file"};

// The "valid_loss" values of a metrics file.
std::vector<double> valid_losses(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);)
    if (const auto at = line.find("\"valid_loss\": "); at != std::string::npos) out.push_back(std::stod(line.substr(at + 14)));
  return out;
}

// The values of one key of a metrics file, in order.
std::vector<double> values_of(const fs::path& metrics, const std::string& key) {
  std::vector<double> out;
  std::ifstream in(metrics);
  const std::string field = "\"" + key + "\": ";
  for (std::string line; std::getline(in, line);)
    if (const auto at = line.find(field); at != std::string::npos) out.push_back(std::stod(line.substr(at + field.size())));
  return out;
}

std::vector<double> numbers(const std::vector<std::string>& text) {
  std::vector<double> out;
  for (const auto& t : text) out.push_back(std::stod(t));
  return out;
}

std::vector<double> ParallelTool::moe_single_losses() const {
  const auto single = dir_ / "single.jsonl";
  const auto r = run(layout_argv(kMoeFlags, single, {}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return numbers(losses(single));
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "iteration " << i + 1;
}

TEST_F(ParallelTool, Dp4GivesTheSingleProcessTrainingAndValidationLossesAndItsCheckpointResumesOnOneProcess) {
  const auto single = dir_ / "single.jsonl";
  const std::vector<std::string> eval = {"--eval-interval", "4", "--eval-iters", "2"};
  auto flags = eval;
  for (const std::string f : {"--train-iters", "8", "--global-batch-size", "8", "--metrics-file"}) flags.push_back(f);
  flags.push_back(single.string());
  auto r = run(train_argv(flags));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = numbers(losses(single));
  ASSERT_EQ(want.size(), 8u);
  const auto want_valid = valid_losses(single);
  ASSERT_EQ(want_valid.size(), 3u);  // at 4, at 8 and at the end of training

  for (const bool zero : {false, true}) {
    const auto dp4 = dir_ / (zero ? "dp4-zero.jsonl" : "dp4.jsonl");
    flags.back() = dp4.string();
    if (zero) flags.push_back("--use-distributed-optimizer");
    r = run(mpi(train_argv(flags)));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_close(numbers(losses(dp4)), want);
    expect_close(valid_losses(dp4), want_valid);
  }

  // DP4 with the distributed optimizer saves at 4 and exits; one process resumes for the last 4.
  const auto first = dir_ / "first.jsonl", second = dir_ / "second.jsonl";
  const auto ckpt = (dir_ / "ckpt").string();
  r = run(mpi(train_argv({"--train-iters", "8", "--global-batch-size", "8", "--use-distributed-optimizer", "--save", ckpt,
                          "--exit-interval", "4", "--metrics-file", first.string()})));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(train_argv({"--train-iters", "8", "--global-batch-size", "8", "--load", ckpt, "--metrics-file", second.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto got = numbers(losses(first));
  for (double l : numbers(losses(second))) got.push_back(l);
  expect_close(got, want);
}

TEST_F(ParallelTool, SigkilledRankEndsTheJobNamingItAndTheLastCheckpointContinuesTheRun) {
  // mpirun's own rule: a rank killed by a signal ends the job, and mpirun names it.
  const auto ckpt = dir_ / "ckpt";
  const std::vector<std::string> saving = {"--save", ckpt.string(), "--save-interval", "2", "--use-distributed-optimizer"};
  const auto [r, seconds] = signal_mid_run(SIGKILL, 2, {}, "", saving);
  std::printf("SIGKILL of rank 2 under mpirun: exit %d after %.1f s\n", r.exit_code, seconds);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(seconds, 6.0 + 5.0);
  EXPECT_NE(r.err.find("rank 2"), std::string::npos) << r.err;

  // `latest` names a complete checkpoint; DP4 resumes from it for 2 iterations, which are the ones a
  // straight single-process run of the same flags computes.
  std::ifstream latest(ckpt / "latest");
  std::string name;
  std::getline(latest, name);
  ASSERT_EQ(name.rfind("iter_", 0), 0u) << name;
  const int saved = std::stoi(name.substr(5));
  const auto resumed = dir_ / "resumed.jsonl", straight = dir_ / "straight.jsonl";
  const std::vector<std::string> common = {"--train-iters", "100000", "--global-batch-size", "8"};
  auto flags = common;
  flags.insert(flags.end(), {"--load", ckpt.string(), "--exit-interval", "2", "--use-distributed-optimizer",
                             "--metrics-file", resumed.string()});
  auto again = run(mpi(train_argv(flags)));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  flags = common;
  flags.insert(flags.end(), {"--exit-interval", std::to_string(saved + 2), "--metrics-file", straight.string()});
  again = run(train_argv(flags));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const auto want = numbers(losses(straight));
  ASSERT_EQ(want.size(), static_cast<std::size_t>(saved + 2));
  expect_close(numbers(losses(resumed)), {want.end() - 2, want.end()});
  std::printf("resumed from iteration %d under DP4: the next 2 losses are the straight run's\n", saved);
}

TEST_F(ParallelTool, SigkilledRankIsNamedByEverySurvivorWhenTheLauncherKeepsThemRunning) {
  // --enable-recovery keeps the other ranks alive (as a launcher that does not watch its ranks would):
  // each survivor's watchdog must name rank 2 and exit 1 within the timeout. The shell reports each
  // rank's exit status (mpirun itself exits 0 under recovery).
  const auto [r, seconds] = signal_mid_run(SIGKILL, 2, {"--enable-recovery"},
                                           "\"$0\" \"$@\"; echo \"rank $OMPI_COMM_WORLD_RANK exited $?\" >&2");
  std::printf("SIGKILL of rank 2, survivors on their own: job ended after %.1f s\n", seconds);
  EXPECT_LT(seconds, 6.0 + 5.0);
  for (const int survivor : {0, 1, 3}) {
    EXPECT_NE(r.err.find(fmt::format("dlm-train: rank {}: ", survivor)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(fmt::format("rank {} exited 1", survivor)), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("did not complete within 0.1 min (--distributed-timeout-minutes): rank 2 did not answer (dead or hung)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("rank 2 exited 137"), std::string::npos) << r.err;
}

TEST_F(ParallelTool, SigkilledRankOfATensorPipelineLayoutIsNamedByEverySurvivor) {
  // TP2xPP2: the survivors wait in tensor collectives and pipeline receives, not only in data-parallel
  // reductions; each must still name rank 1 within the timeout.
  const auto [r, seconds] = signal_mid_run(
      SIGKILL, 1, {"--enable-recovery"}, "\"$0\" \"$@\"; echo \"rank $OMPI_COMM_WORLD_RANK exited $?\" >&2",
      {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"});
  std::printf("SIGKILL of rank 1 under TP2xPP2, survivors on their own: job ended after %.1f s\n", seconds);
  EXPECT_LT(seconds, 6.0 + 5.0);
  for (const int survivor : {0, 2, 3}) {
    EXPECT_NE(r.err.find(fmt::format("dlm-train: rank {}: ", survivor)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(fmt::format("rank {} exited 1", survivor)), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("rank 1 did not answer (dead or hung)"), std::string::npos) << r.err;
}

TEST_F(ParallelTool, HungRankIsNamedWithinTheTimeout) {
  const auto [r, seconds] = signal_mid_run(SIGSTOP, 1);
  std::printf("SIGSTOP of rank 1: exit %d after %.1f s\n", r.exit_code, seconds);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(seconds, 6.0 + 5.0);
  EXPECT_NE(r.err.find("rank 1 did not answer (dead or hung)"), std::string::npos) << r.err;
}

TEST_F(ParallelTool, TensorAndPipelineLayoutsGiveTheSingleProcessLossesAndResumeUnderAnotherLayout) {
  const std::vector<std::string> common = {"--num-layers", "4", "--train-iters", "8", "--global-batch-size", "8",
                                           "--eval-interval", "4", "--eval-iters", "2", "--metrics-file"};
  auto with = [&](const fs::path& metrics, const std::vector<std::string>& layout) {
    return layout_argv(common, metrics, layout);
  };
  const auto single = dir_ / "single.jsonl";
  auto r = run(with(single, {}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = numbers(losses(single));
  const auto want_valid = valid_losses(single);
  ASSERT_EQ(want.size(), 8u);
  ASSERT_EQ(want_valid.size(), 3u);  // at 4, at 8 and at the end of training
  const std::vector<std::vector<std::string>> layouts = {
      {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel"},
      {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer"},
      {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}};
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    const auto metrics = dir_ / fmt::format("layout{}.jsonl", k);
    r = run(mpi(layout_argv(common, metrics, layouts[k])));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_close(numbers(losses(metrics)), want);
    expect_close(valid_losses(metrics), want_valid);
  }
  // TP2xPP2 saves at 4 and exits; DP4 resumes from its shards for the last 4.
  const auto first = dir_ / "first.jsonl", second = dir_ / "second.jsonl";
  const auto ckpt = (dir_ / "ckpt").string();
  r = run(mpi(with(first, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--save", ckpt,
                           "--exit-interval", "4"})));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(mpi(with(second, {"--load", ckpt})));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto got = numbers(losses(first));
  for (double l : numbers(losses(second))) got.push_back(l);
  expect_close(got, want);
  // The validation iterator resumes after the evaluation at 4 (Megatron's rule): the same three losses.
  auto got_valid = valid_losses(first);
  for (double l : valid_losses(second)) got_valid.push_back(l);
  expect_close(got_valid, want_valid);
}

// --async-save on 4 ranks: TP2 x PP2 (every rank writes its shard in the background, rank 0 commits once all four
// are in the temp folder) and DP4 (rank 0 writes the whole model): the checkpoints equal the blocking save's bit for
// bit, and the trackers name the last one when the job ends.
TEST_F(ParallelTool, AsyncSaveOnFourRanksWritesTheBlockingSavesCheckpoints) {
  const std::vector<std::vector<std::string>> layouts = {
      {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}, {}};
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    const auto sync = dir_ / fmt::format("sync{}", k), async = dir_ / fmt::format("async{}", k);
    for (const auto& [root, extra] : {std::pair{sync, std::string()}, std::pair{async, std::string("--async-save")}}) {
      std::vector<std::string> flags = {"--num-layers", "4", "--train-iters", "8", "--global-batch-size", "8",
                                        "--save", root.string(), "--save-interval", "2", "--exit-interval", "4"};
      flags.insert(flags.end(), layouts[k].begin(), layouts[k].end());
      if (!extra.empty()) flags.push_back(extra);
      const auto r = run(mpi(train_argv(flags)));
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    EXPECT_EQ(read_all(async / "latest"), "iter_0000004\n");
    EXPECT_EQ(read_all(async / "latest_checkpointed_iteration.txt"), "4");
    for (const char* it : {"iter_0000002", "iter_0000004"}) {
      const auto r = run({kCkptTool, "validate", (async / it).string(), "--against", (sync / it).string(), "--rtol", "0",
                          "--atol", "0"});
      EXPECT_EQ(r.exit_code, 0) << "layout " << k << " " << it << ": " << r.err;
    }
  }
}

// A mixture-of-experts model (router losses on: their gradients shape the later losses) under DP4 and PP2 x DP2
// follows the single process: the router losses are weighted per micro-batch as the cross-entropy is.
TEST_F(ParallelTool, MoeLayoutsGiveTheSingleProcessLosses) {
  const std::vector<std::string> common = kMoeFlags;
  ChildResult r;
  const auto want = moe_single_losses();
  ASSERT_EQ(want.size(), 6u);
  const std::vector<std::vector<std::string>> layouts = {{}, {"--pipeline-model-parallel-size", "2"}};
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    const auto metrics = dir_ / fmt::format("moe_layout{}.jsonl", k);
    r = run(mpi(layout_argv(common, metrics, layouts[k])));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_close(numbers(losses(metrics)), want);
  }
  // Without the router losses the run differs: they took effect.
  auto flags = common;
  flags[flags.size() - 4] = "0";
  flags[flags.size() - 2] = "0";
  flags.push_back((dir_ / "no_router_loss.jsonl").string());
  ASSERT_EQ(run(train_argv(flags)).exit_code, 0);
  EXPECT_NE(numbers(losses(dir_ / "no_router_loss.jsonl")), want);
}

// Expert parallelism (--expert-model-parallel-size): EP2 on two ranks, EP2 x DP2 (with and without the distributed
// optimizer), EP4 and EP2 x PP2 on four follow the single process's losses (aux and z losses on). Each EP rank
// holds half the experts (its checkpoint shard files say so); a checkpoint saved at EP2 x DP2 continues the same
// losses at EP1 (one process) and at EP4.
TEST_F(ParallelTool, ExpertParallelLayoutsGiveTheSingleProcessLossesAndTheirCheckpointsReshard) {
  const auto with = [&](const fs::path& metrics, const std::vector<std::string>& layout) {
    return layout_argv(kMoeFlags, metrics, layout);
  };
  const auto want = moe_single_losses();
  ASSERT_EQ(want.size(), 6u);
  ChildResult r;
  struct Layout {
    int ranks;
    std::vector<std::string> flags;
  };
  const std::vector<Layout> layouts = {
      {2, {"--expert-model-parallel-size", "2"}},
      {4, {"--expert-model-parallel-size", "2"}},
      {4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
      {4, {"--expert-model-parallel-size", "4", "--use-distributed-optimizer"}},
      {4, {"--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}}};
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    const auto metrics = dir_ / fmt::format("ep_layout{}.jsonl", k);
    r = run(mpi(with(metrics, layouts[k].flags), {}, layouts[k].ranks));
    ASSERT_EQ(r.exit_code, 0) << "layout " << k << ": " << r.err;
    expect_close(numbers(losses(metrics)), want);
    // The MoE metrics are the whole step's on every layout (summed over the ranks' micro-batches and layers).
    for (const std::string key : {"load_balancing_loss", "z_loss", "moe_max_load"})
      expect_close(values_of(metrics, key), values_of(dir_ / "single.jsonl", key));
  }
  ASSERT_EQ(values_of(dir_ / "single.jsonl", "load_balancing_loss").size(), 6u);

  // Token dropping (--moe-expert-capacity-factor 0.5: each expert keeps at most 8 of a micro-batch's 64 routed slots)
  // drops the same tokens on every layout: the capacity is each micro-batch's, where the router runs. A shared expert
  // (replicated, a dense tensor) rides along.
  const std::vector<std::string> dropping = {"--moe-expert-capacity-factor", "0.5", "--moe-token-drop-policy", "position",
                                             "--moe-shared-expert-intermediate-size", "8"};
  r = run(with(dir_ / "drop_single.jsonl", dropping));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ep_dropping = dropping;
  ep_dropping.insert(ep_dropping.end(), {"--expert-model-parallel-size", "2"});
  r = run(mpi(with(dir_ / "drop_ep2.jsonl", ep_dropping)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto dropped = numbers(losses(dir_ / "drop_single.jsonl"));
  expect_close(numbers(losses(dir_ / "drop_ep2.jsonl")), dropped);
  EXPECT_NE(dropped, want);

  // EP2 x DP2 with the distributed optimizer saves at 3 and exits; EP1 and EP4 continue.
  const auto ckpt = (dir_ / "ep_ckpt").string();
  const auto first = dir_ / "ep_first.jsonl";
  r = run(mpi(with(first, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer", "--save", ckpt,
                           "--exit-interval", "3"})));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "iter_0000003" / "rank_tp00_pp00_ep01.h5"));
  EXPECT_FALSE(fs::exists(fs::path(ckpt) / "iter_0000003" / "rank_tp00_pp00.h5"));
  const std::vector<std::pair<int, std::vector<std::string>>> resumes = {
      {1, {}}, {4, {"--expert-model-parallel-size", "4"}}, {4, {"--expert-model-parallel-size", "4", "--use-distributed-optimizer"}}};
  for (std::size_t k = 0; k < resumes.size(); ++k) {
    const auto second = dir_ / fmt::format("ep_second{}.jsonl", k);
    auto flags = resumes[k].second;
    flags.insert(flags.end(), {"--load", ckpt});
    const auto argv = with(second, flags);
    r = run(resumes[k].first == 1 ? argv : mpi(argv, {}, resumes[k].first));
    ASSERT_EQ(r.exit_code, 0) << "resume " << k << ": " << r.err;
    auto got = numbers(losses(first));
    for (double l : numbers(losses(second))) got.push_back(l);
    expect_close(got, want);
  }
}

// Tensor parallelism of MoE layers (expert tensor parallelism = TP, megatron-core's default; a shared expert on):
// TP2, TP2 with sequence parallelism, TP2 x EP2 (its expert groups one tensor rank's ranks) follow the single
// process's losses, MoE metrics and gradient norms (the replicated router's gradient and losses counted once). A TP2 x
// EP2 checkpoint (each rank's file: its experts' column/row halves) continues on one process, and the single
// process's under TP2 x EP2 with sequence parallelism and the distributed optimizer.
TEST_F(ParallelTool, MoeTensorParallelLayoutsGiveTheSingleProcessLossesAndTheirCheckpointsReshard) {
  const auto with = [&](const fs::path& metrics, std::vector<std::string> layout) {
    layout.insert(layout.end(), {"--moe-shared-expert-intermediate-size", "8"});
    return layout_argv(kMoeFlags, metrics, layout);
  };
  const auto single = dir_ / "tp_single.jsonl";
  ChildResult r = run(with(single, {}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = numbers(losses(single));
  ASSERT_EQ(want.size(), 6u);
  struct Layout {
    int ranks;
    std::vector<std::string> flags;
  };
  const std::vector<Layout> layouts = {
      {2, {"--tensor-model-parallel-size", "2"}},
      {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {4, {"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "2"}}};
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    const auto metrics = dir_ / fmt::format("tp_layout{}.jsonl", k);
    r = run(mpi(with(metrics, layouts[k].flags), {}, layouts[k].ranks));
    ASSERT_EQ(r.exit_code, 0) << "layout " << k << ": " << r.err;
    expect_close(numbers(losses(metrics)), want);
    for (const std::string key : {"load_balancing_loss", "z_loss", "moe_max_load", "grad_norm"})
      expect_close(values_of(metrics, key), values_of(single, key));
  }
  ASSERT_EQ(values_of(single, "grad_norm").size(), 6u);

  // TP2 x EP2 saves at 3; one process continues. One process saves at 3; TP2 x EP2 (SP, distributed optimizer)
  // continues.
  const std::vector<std::string> tp_ep = {"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2"};
  auto saving = [&](std::vector<std::string> flags, const std::string& ckpt) {
    flags.insert(flags.end(), {"--save", ckpt, "--exit-interval", "3"});
    return flags;
  };
  const auto ckpt = (dir_ / "tp_ep_ckpt").string(), single_ckpt = (dir_ / "tp_single_ckpt").string();
  r = run(mpi(with(dir_ / "tp_first.jsonl", saving(tp_ep, ckpt))));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "iter_0000003" / "rank_tp01_pp00_ep01.h5"));
  r = run(with(dir_ / "tp_second.jsonl", {"--load", ckpt}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto got = numbers(losses(dir_ / "tp_first.jsonl"));
  for (double l : numbers(losses(dir_ / "tp_second.jsonl"))) got.push_back(l);
  expect_close(got, want);

  r = run(with(dir_ / "one_first.jsonl", saving({}, single_ckpt)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto resume = tp_ep;
  resume.insert(resume.end(), {"--sequence-parallel", "--use-distributed-optimizer", "--load", single_ckpt});
  r = run(mpi(with(dir_ / "one_second.jsonl", resume)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  got = numbers(losses(dir_ / "one_first.jsonl"));
  for (double l : numbers(losses(dir_ / "one_second.jsonl"))) got.push_back(l);
  expect_close(got, want);
}

TEST_F(ParallelTool, LayoutFlagsAreCheckedBeforeStarting) {
  auto r = run(train_argv({"--train-iters", "2", "--tensor-model-parallel-size", "2"}));
  EXPECT_EQ(last_error_line(r, "dlm-train"),
            "dlm-train: --tensor-model-parallel-size 2 x --pipeline-model-parallel-size 1 needs that many ranks or a "
            "multiple: launch under mpirun -np N or srun");
  EXPECT_EQ(r.exit_code, 1);
  r = run(train_argv({"--train-iters", "2", "--num-layers-per-virtual-pipeline-stage", "1"}));
  EXPECT_EQ(last_error_line(r, "dlm-train"),
            "dlm-train: --num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size of at least 2 (as in "
            "Megatron)");
  // Interleaving with 1 micro-batch per data-parallel rank (global batch 4 = micro-batch 2 x DP 2) on 2 stages.
  r = run(mpi(train_argv({"--train-iters", "2", "--num-layers", "4", "--pipeline-model-parallel-size", "2",
                          "--num-layers-per-virtual-pipeline-stage", "1"})));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("dlm-train: the interleaved pipeline schedule needs the number of micro-batches per data-parallel "
                       "rank (1) to be a multiple of --pipeline-model-parallel-size 2"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("iteration"), std::string::npos) << r.err;  // refused before training
  r = run(mpi(train_argv({"--train-iters", "2", "--tensor-model-parallel-size", "3"})));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--tensor-model-parallel-size"), std::string::npos) << r.err;
}

TEST_F(ParallelTool, DryRunNeedsNoDataAndPrintsEveryStage) {
  const std::string cmd = kTrainTool +
                          " --dry-run --world-size 16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
                          " --sequence-parallel --use-distributed-optimizer --bf16 --num-layers 4 --hidden-size 64"
                          " --ffn-hidden-size 128 --num-attention-heads 4 --group-query-attention --num-query-groups 2"
                          " --vocab-size 256 --seq-length 32 --max-position-embeddings 64 --micro-batch-size 2"
                          " --global-batch-size 16 --train-iters 1 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << out;
  EXPECT_NE(out.find("16 ranks = TP 2 x DP 4 x PP 2, sequence parallel, distributed optimizer"), std::string::npos) << out;
  EXPECT_NE(out.find("2 micro-batches per rank per step"), std::string::npos) << out;
  EXPECT_NE(out.find("    0         0-7     0-1         45312"), std::string::npos) << out;
  EXPECT_NE(out.find("    1        8-15     2-3         45376"), std::string::npos) << out;
}

// --full-validation under every layout: the whole validation split, its micro-batches spread over the data-parallel
// ranks (some running one more than others) or run through a pipeline's schedule (the last call short), gives one
// process's validation losses.
TEST_F(ParallelTool, FullValidationIsTheSingleProcesssUnderEveryLayout) {
  const std::vector<std::string> common = {"--num-layers", "4", "--train-iters", "4", "--global-batch-size", "8",
                                           "--eval-interval", "2", "--eval-iters", "0", "--full-validation",
                                           "--metrics-file"};
  const auto single = dir_ / "single.jsonl";
  auto r = run(layout_argv(common, single, {}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = valid_losses(single);
  ASSERT_EQ(want.size(), 3u);  // at 2, at 4 and at the end of training
  // The split's samples do not fill whole rounds of 4 ranks x 2 rows: the ranks run different counts.
  const std::string said = "reads the whole validation split, ";
  const auto at = r.err.find(said);
  ASSERT_NE(at, std::string::npos) << r.err;
  const long samples = std::stol(r.err.substr(at + said.size()));
  EXPECT_NE(samples % 8, 0) << samples;
  const std::vector<std::vector<std::string>> layouts = {
      {},
      {"--use-distributed-optimizer"},
      {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"},
      {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}};
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    const auto metrics = dir_ / fmt::format("full{}.jsonl", k);
    r = run(mpi(layout_argv(common, metrics, layouts[k])));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    SCOPED_TRACE(fmt::format("layout {}", k));
    expect_close(valid_losses(metrics), want);
  }
}

// --log-params-norm and --log-num-zeros-in-grad count the whole model once, whatever the layout: the distributed
// optimizer's ranges summed over DP, TP's replicated norms and the pipeline's stages summed over the model's ranks.
TEST_F(ParallelTool, ParamsNormAndGradientZerosAreTheWholeModelsUnderEveryLayout) {
  const auto single = dir_ / "single.jsonl";
  std::vector<std::string> flags = {"--train-iters", "4", "--global-batch-size", "8", "--log-params-norm",
                                    "--log-num-zeros-in-grad", "--metrics-file", single.string()};
  auto r = run(train_argv(flags));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto norms = numbers(metric(single, "params_norm")), zeros = numbers(metric(single, "num_zeros"));
  ASSERT_EQ(norms.size(), 4u);
  ASSERT_GT(zeros.back(), 0);  // the embedding rows of ids no batch holds get no gradient
  const std::vector<std::vector<std::string>> layouts = {
      {"--use-distributed-optimizer"}, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}};
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    const auto out = dir_ / ("layout" + std::to_string(k) + ".jsonl");
    auto f = flags;
    f.back() = out.string();
    f.insert(f.end(), layouts[k].begin(), layouts[k].end());
    r = run(mpi(train_argv(f)));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    SCOPED_TRACE(layouts[k].front());
    expect_close(numbers(metric(out, "params_norm")), norms);
    EXPECT_EQ(numbers(metric(out, "num_zeros")), zeros);
  }
}

}  // namespace
}  // namespace dlm::test
