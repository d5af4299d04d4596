// dlm-train as a user runs it: a resumed run (after a clean stop, and after SIGKILL) continues the very
// same run bit for bit; bad input stops before any compute with one line naming the problem.
#include <signal.h>

#include <chrono>
#include <thread>

#include "tool_fixture.h"

namespace fs = std::filesystem;

namespace dlm::test {
namespace {

using TrainTool = ToolTest;

TEST_F(TrainTool, TrainsAndResumesTheSameRunBitForBit) {
  const auto straight = dir_ / "straight.jsonl";
  auto r = run(train_argv({"--train-iters", "8", "--metrics-file", straight.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = losses(straight);
  ASSERT_EQ(want.size(), 8u);
  EXPECT_NE(r.err.find("unigram entropy"), std::string::npos) << r.err;

  // 4 iterations, save and exit (--exit-interval), then --load for the last 4.
  const auto first = dir_ / "first.jsonl", second = dir_ / "second.jsonl";
  const auto ckpt = (dir_ / "ckpt").string();
  r = run(train_argv({"--train-iters", "8", "--save", ckpt, "--exit-interval", "4", "--metrics-file", first.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(train_argv({"--train-iters", "8", "--load", ckpt, "--save", ckpt, "--metrics-file", second.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto got = losses(first);
  for (const auto& l : losses(second)) got.push_back(l);
  EXPECT_EQ(got, want);
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "iter_0000008" / "metadata.json"));
}

TEST_F(TrainTool, SigkillThenResumeFromLatestContinuesTheRun) {
  const auto straight = dir_ / "straight.jsonl";
  ASSERT_EQ(run(train_argv({"--train-iters", "12", "--metrics-file", straight.string()})).exit_code, 0);
  const auto want = losses(straight);
  const auto ckpt = dir_ / "ckpt";
  const auto err = (dir_ / "err").string();
  // Saves every 2 iterations; killed as soon as a checkpoint is committed, wherever the run then is.
  const pid_t pid = spawn(train_argv({"--train-iters", "12", "--save", ckpt.string(), "--save-interval", "2"}), err);
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(ckpt / "latest") && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(pid, SIGKILL);
  wait_child(pid, err);
  ASSERT_TRUE(fs::exists(ckpt / "latest"));
  const auto resumed = dir_ / "resumed.jsonl";
  const auto r = run(train_argv({"--train-iters", "12", "--load", ckpt.string(), "--metrics-file", resumed.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = losses(resumed);
  ASSERT_GE(got.size(), 1u);
  ASSERT_LE(got.size(), 10u);  // resumed from iteration >= 2
  // The resumed iterations are the last ones of the straight run.
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.end() - static_cast<std::ptrdiff_t>(got.size())));
}

TEST_F(TrainTool, BadInputFailsBeforeComputeWithOneLine) {
  struct Case {
    std::vector<std::string> flags;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"--train-iters", "2", "--data-path", (dir_ / "missing").string()}, "missing"},
      {{"--train-iters", "2", "--vocab-size", "150", "--mask-token", "149"}, "the data holds token id 197, but the vocabulary has 150 ids"},
      {{"--train-iters", "2", "--hidden-size", "30"}, "--num-attention-heads 4 does not divide --hidden-size 30"},
      {{"--train-iters", "2", "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "3"},
       "--num-query-groups 3 does not divide --num-attention-heads 4"},
      {{"--train-iters", "2", "--max-position-embeddings", "8"}, "--seq-length 16 is longer than --max-position-embeddings 8"},
      {{"--train-iters", "2", "--mask-token", "250"}, "--mask-token 250 is outside the vocabulary of 200 ids"},
      {{"--train-iters", "2", "--load", (dir_ / "nothing").string()}, "no such folder"},
      {{"--train-iters", "2", "--device", "tpu"}, "--device: 'tpu' is not cpu or cuda"},
  };
  for (const auto& c : cases) {
    const auto r = run(train_argv(c.flags));
    const std::string line = last_error_line(r, "dlm-train");
    EXPECT_NE(line.find(c.expect), std::string::npos) << "exit " << r.exit_code << ", stderr:\n" << r.err;
  }
  // A checkpoint whose model differs from the flags.
  const auto ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(run(train_argv({"--train-iters", "1", "--save", ckpt})).exit_code, 0);
  const auto r = run(train_argv({"--train-iters", "2", "--load", ckpt, "--ffn-hidden-size", "96"}));
  const std::string line = last_error_line(r, "dlm-train");
  EXPECT_NE(line.find("the checkpoint has --ffn-hidden-size 64, the flags say 96"), std::string::npos) << r.err;
  EXPECT_NE(line.find("metadata.json"), std::string::npos) << line;
}

// Where no GPU (or no CUDA backend) is there, asking for one is one line before any data is read.
TEST_F(TrainTool, DeviceCudaWithoutAGpuIsOneLine) {
  const auto r = run(train_argv({"--train-iters", "1", "--device", "cuda"}));
  const std::string line = last_error_line(r, "dlm-train");
  if (r.exit_code == 0 || line.find("CudaModel") != std::string::npos) GTEST_SKIP() << "a GPU is present";
  EXPECT_NE(line.find("--device cuda: "), std::string::npos) << "exit " << r.exit_code << ", stderr:\n" << r.err;
}

}  // namespace
}  // namespace dlm::test
