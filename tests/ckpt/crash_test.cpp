// SIGKILL during saves: whatever instant the writer dies at, `latest` names a complete checkpoint that
// validates and loads the weights of its iteration, and the unfinished *.tmp folder is never read.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "dlm/ckpt/checkpoint.h"
#include "dlm/ckpt/tools.h"
#include "dlm/common/atomic_file.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace dlm::ckpt;

namespace {

ModelConfig crash_config() {
  ModelConfig c = test::small_config();
  c.num_layers = 4;
  c.hidden_size = 128;
  c.ffn_hidden_size = 256;
  return c;
}

// The weights saved at iteration i are random_model(seed i): a loaded checkpoint proves its iteration.
TrainingTensors state_of(const ModelConfig& c, std::int64_t iteration) {
  return {test::random_model(c, static_cast<std::uint32_t>(iteration)), test::random_model(c, 1), test::random_model(c, 2)};
}

[[noreturn]] void save_forever(const fs::path& root, const ModelConfig& c) {
  std::int64_t next = 0;
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string n = e.path().filename().string();
      if (n.starts_with("iter_") && !n.ends_with(".tmp")) next = std::max<std::int64_t>(next, std::stoll(n.substr(5)) + 1);
    }
  const ParallelLayout layout{.tp = 2, .pp = 2};
  for (;; ++next) {
    TrainingTensors s = state_of(c, next);
    save_checkpoint(root.string(), c, layout, s, {.iteration = next, .consumed_samples = next * 8});
  }
}

TEST(CrashSafety, SigkillDuringSaveNeverBreaksLatest) {
  const auto root = test::fresh_dir("crash") / "ckpt";
  const ModelConfig c = crash_config();
  // Kill instants spread over about two saves, whatever this machine's disk makes a save cost.
  const auto t0 = std::chrono::steady_clock::now();
  save_checkpoint((root.parent_path() / "timing").string(), c, {.tp = 2, .pp = 2}, state_of(c, 0), {});
  const auto save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<long> delay_us(0, 2 * save_us);
  int kills = 0, with_tmp = 0, checked = 0;
  for (int round = 0; round < 24; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        save_forever(root, c);
      } catch (...) {
        ::_exit(3);
      }
    }
    if (round == 0)  // the first round lets one checkpoint complete, so that every later one has a `latest`
      for (int i = 0; i < 2000 && !fs::exists(root / "latest"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped by itself (status " << status << ")";
    ++kills;
    for (const auto& e : fs::directory_iterator(root)) with_tmp += e.path().filename().string().ends_with(".tmp");
    if (!fs::exists(root / "latest")) continue;  // killed before the first commit
    const std::string dir = resolve_checkpoint(root.string());
    ASSERT_FALSE(dir.ends_with(".tmp"));
    const Report r = validate_checkpoint(root.string());
    ASSERT_TRUE(r.ok()) << "round " << round << ": " << (r.errors.empty() ? "" : r.errors[0]);
    CheckpointReader reader(root.string());
    const std::int64_t it = reader.metadata().state.iteration;
    EXPECT_EQ(reader.metadata().state.consumed_samples, it * 8);
    const TrainingTensors loaded = reader.read_global();
    const TrainingTensors expect = state_of(c, it);
    for (const auto& [name, t] : expect.params) ASSERT_EQ(loaded.params.at(name).bytes, t.bytes) << name << " at iteration " << it;
    ++checked;
  }
  EXPECT_EQ(kills, 24);
  EXPECT_GE(checked, 20);
  EXPECT_GE(with_tmp, 3) << "the kills never landed inside a save";
  std::printf("%d kills, %d left an unfinished *.tmp, %d checkpoints validated\n", kills, with_tmp, checked);
}

}  // namespace
