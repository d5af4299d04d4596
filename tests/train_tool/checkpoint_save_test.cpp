// dlm-train's checkpoint saving as Megatron users drive it (checkpoint_saver.h): --async-save writes the same
// checkpoint as a blocking save and resumes the same loss curve; a SIGKILL while the background thread writes
// leaves the previous checkpoint as `latest`, valid and loadable; non-persistent checkpoints keep only the newest,
// and --load takes the newer of the two folders.
#include <signal.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "tool_fixture.h"

namespace fs = std::filesystem;

namespace dlm::test {
namespace {

using CheckpointSave = ToolTest;

std::vector<std::string> iteration_folders(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && e.path().filename().string().rfind("iter_", 0) == 0) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(CheckpointSave, AsyncSaveWritesTheBlockingSavesCheckpointAndResumesTheSameCurve) {
  const auto straight = dir_ / "straight.jsonl";
  ASSERT_EQ(run(train_argv({"--train-iters", "12", "--metrics-file", straight.string()})).exit_code, 0);
  const auto want = losses(straight);
  ASSERT_EQ(want.size(), 12u);

  const auto sync = (dir_ / "sync").string(), async = (dir_ / "async").string();
  ASSERT_EQ(run(train_argv({"--train-iters", "12", "--save", sync, "--save-interval", "3", "--exit-interval", "6"})).exit_code, 0);
  auto r = run(train_argv({"--train-iters", "12", "--save", async, "--save-interval", "3", "--exit-interval", "6",
                           "--async-save"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The run's end waited for the last background save: committed, tracker written.
  EXPECT_EQ(read_all(dir_ / "async" / "latest"), "iter_0000006\n");
  EXPECT_EQ(read_all(dir_ / "async" / "latest_checkpointed_iteration.txt"), "6");
  EXPECT_EQ(iteration_folders(dir_ / "async"), (std::vector<std::string>{"iter_0000003", "iter_0000006"}));
  // Bit for bit the blocking save's tensors (weights and moments).
  for (const char* it : {"iter_0000003", "iter_0000006"}) {
    r = run({kCkptTool, "validate", (dir_ / "async" / it).string(), "--against", (dir_ / "sync" / it).string(), "--rtol",
             "0", "--atol", "0"});
    EXPECT_EQ(r.exit_code, 0) << it << ": " << r.err;
  }
  const auto resumed = dir_ / "resumed.jsonl";
  r = run(train_argv({"--train-iters", "12", "--load", async, "--save", async, "--save-interval", "3", "--async-save",
                      "--metrics-file", resumed.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(losses(resumed), std::vector<std::string>(want.begin() + 6, want.end()));
  EXPECT_EQ(read_all(dir_ / "async" / "latest_checkpointed_iteration.txt"), "12");
}

// A model whose state (about 160 MB: a 50000-id vocabulary) takes a while to write. The kill comes once a save
// point has handed its write to the background (its pause is logged) and that save's temp folder is still there;
// after the kill, that folder still being there means the kill hit the write.
TEST_F(CheckpointSave, SigkillDuringTheBackgroundWriteLeavesThePreviousCheckpointAsLatest) {
  const auto ckpt = dir_ / "ckpt";
  const auto metrics = dir_ / "metrics.jsonl";
  const auto command = train_argv({"--train-iters", "400", "--vocab-size", "50000", "--hidden-size", "256",
                                   "--num-attention-heads", "4", "--ffn-hidden-size", "128", "--save", ckpt.string(),
                                   "--save-interval", "2", "--async-save", "--metrics-file", metrics.string()});
  bool hit = false;
  std::int64_t interrupted = -1;
  for (int attempt = 0; attempt < 6 && !hit; ++attempt) {
    fs::remove_all(ckpt);
    fs::remove(metrics);
    const auto err = (dir_ / "err").string();
    const pid_t pid = spawn(command, err);
    const auto t0 = std::chrono::steady_clock::now();
    bool killed = false;
    while (!killed && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
      // The save point of iteration k (k >= 4: one checkpoint committed before it) has returned to training (its
      // pause is logged) while its temp folder is still there: the background write is in flight.
      const std::string log = read_all(err);
      for (std::int64_t k = 4; k <= 400 && !killed; k += 2) {
        if (log.find(fmt::format("iteration {}: the checkpoint held training", k)) == std::string::npos) break;
        if (fs::exists(ckpt / fmt::format("iter_{:07}.tmp", k)) && fs::exists(ckpt / "latest")) {
          ::kill(pid, SIGKILL);
          killed = true;
          interrupted = k;
        }
      }
      if (!killed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!killed) ::kill(pid, SIGKILL);
    const auto result = wait_child(pid, err);
    ASSERT_TRUE(killed) << "no background write was caught in 120 s: " << result.err;
    ASSERT_EQ(result.signal, SIGKILL);
    hit = fs::exists(ckpt / fmt::format("iter_{:07}.tmp", interrupted));
  }
  ASSERT_TRUE(hit) << "every kill came after the background write had finished";
  // `latest` names a checkpoint before the interrupted one, complete: it validates and a run resumes from it.
  const std::string latest = read_all(ckpt / "latest");
  ASSERT_EQ(latest.rfind("iter_", 0), 0u) << latest;
  const std::int64_t committed = std::stoll(latest.substr(5));
  EXPECT_LT(committed, interrupted);
  EXPECT_FALSE(fs::exists(ckpt / fmt::format("iter_{:07}", interrupted)));
  EXPECT_EQ(read_all(ckpt / "latest_checkpointed_iteration.txt"), std::to_string(committed));
  auto r = run({kCkptTool, "validate", ckpt.string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto resume = command;
  for (std::size_t i = 0; i < resume.size(); ++i)
    if (resume[i] == "--train-iters") resume[i + 1] = std::to_string(committed + 2);
  resume.insert(resume.end(), {"--load", ckpt.string()});
  r = run(resume);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(fmt::format("at iteration {}", committed)), std::string::npos) << r.err;
  EXPECT_EQ(read_all(ckpt / "latest"), fmt::format("iter_{:07}\n", committed + 2));
  EXPECT_FALSE(fs::exists(ckpt / fmt::format("iter_{:07}.tmp", interrupted)));  // the next save removed it
}

TEST_F(CheckpointSave, NonPersistentKeepsTheNewestAndLoadTakesTheNewerFolder) {
  const auto straight = dir_ / "straight.jsonl";
  ASSERT_EQ(run(train_argv({"--train-iters", "9", "--metrics-file", straight.string()})).exit_code, 0);
  const auto want = losses(straight);
  const auto ckpt = dir_ / "ckpt";
  const std::vector<std::string> np_flags = {"--non-persistent-save-interval", "3", "--non-persistent-ckpt-type", "global"};
  auto argv = train_argv({"--train-iters", "9", "--save", ckpt.string(), "--save-interval", "4", "--exit-interval", "7"});
  argv.insert(argv.end(), np_flags.begin(), np_flags.end());
  auto r = run(argv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Persistent after 4 and 7 (the stop); non-persistent after 3 and 6, only the newest kept, with its trackers.
  EXPECT_EQ(iteration_folders(ckpt), (std::vector<std::string>{"iter_0000004", "iter_0000007"}));
  EXPECT_EQ(iteration_folders(ckpt / "non_persistent"), (std::vector<std::string>{"iter_0000006"}));
  EXPECT_EQ(read_all(ckpt / "non_persistent" / "latest"), "iter_0000006\n");
  EXPECT_EQ(read_all(ckpt / "non_persistent" / "latest_checkpointed_iteration.txt"), "6");
  EXPECT_EQ(read_all(ckpt / "latest_checkpointed_iteration.txt"), "7");

  // The persistent checkpoint is the newer: --load resumes it.
  auto load = train_argv({"--train-iters", "9", "--load", ckpt.string(), "--non-persistent-ckpt-type", "global"});
  r = run(load);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("iter_0000007 at iteration 7"), std::string::npos) << r.err;

  // A run that died after its non-persistent save of 6 and before the persistent one of 7: the non-persistent one
  // is the newer, and the run continues from it on the uninterrupted run's curve.
  fs::remove_all(ckpt / "iter_0000007");
  std::ofstream(ckpt / "latest") << "iter_0000004\n";
  const auto resumed = dir_ / "resumed.jsonl";
  load = train_argv({"--train-iters", "9", "--load", ckpt.string(), "--non-persistent-ckpt-type", "global",
                     "--metrics-file", resumed.string()});
  r = run(load);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the non-persistent checkpoint in"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("iter_0000006 at iteration 6"), std::string::npos) << r.err;
  EXPECT_EQ(losses(resumed), std::vector<std::string>(want.begin() + 6, want.end()));
  // Without the type, --load reads the persistent folder only (Megatron: no non-persistent type, none loaded).
  r = run(train_argv({"--train-iters", "9", "--load", ckpt.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("iter_0000004 at iteration 4"), std::string::npos) << r.err;
}

TEST_F(CheckpointSave, NonPersistentTypesOtherThanGlobalAreRefusedNamingWhatDlmOffers) {
  auto r = run(train_argv({"--train-iters", "4", "--save", (dir_ / "c").string(), "--non-persistent-save-interval", "2",
                           "--non-persistent-ckpt-type", "local"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(last_error_line(r, "dlm-train"),
            "dlm-train: --non-persistent-ckpt-type local: dlm offers global only (checkpoints in "
            "--non-persistent-global-ckpt-dir, default --save/non_persistent)") << r.err;
  r = run(train_argv({"--train-iters", "4", "--save", (dir_ / "c").string(), "--non-persistent-save-interval", "2"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(last_error_line(r, "dlm-train").find("needs --non-persistent-ckpt-type global"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dlm::test
