// Checkpoint writes (libckpt's save, the path dlm-train and dlm-ckpt take): SIGKILL at 50 random
// instants, a full disk, a `latest` symlink planted by someone else, and names in metadata.json that try
// to leave the checkpoint folder.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "child.h"
#include "dlm/ckpt/checkpoint.h"
#include "dlm/ckpt/tools.h"
#include "dlm/common/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace dlm::ckpt;

namespace {

TrainingTensors state_of(const ModelConfig& c, std::int64_t iteration) {
  return {test::random_model(c, static_cast<std::uint32_t>(iteration)), test::random_model(c, 1), test::random_model(c, 2)};
}

const ParallelLayout kLayout{.tp = 2, .pp = 1};

TEST(CheckpointReliability, SigkillAt50RandomInstantsNeverBreaksLatest) {
  const auto root = test::fresh_dir("kill50") / "ckpt";
  const ModelConfig c = test::small_config();
  const auto t0 = std::chrono::steady_clock::now();
  save_checkpoint((root.parent_path() / "timing").string(), c, kLayout, state_of(c, 0), {});
  const long save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  std::mt19937 rng(50);
  std::uniform_int_distribution<long> delay_us(0, 3 * save_us);
  int with_tmp = 0, checked = 0;
  for (int round = 0; round < 50; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        for (std::int64_t it = round * 1000;; ++it) save_checkpoint(root.string(), c, kLayout, state_of(c, it), {.iteration = it, .consumed_samples = it * 8});
      } catch (...) {
        ::_exit(3);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped by itself (status " << status << ")";
    for (const auto& n : dlm::test::names_in(root)) with_tmp += n.ends_with(".tmp");
    if (!fs::exists(root / "latest")) continue;
    ASSERT_TRUE(validate_checkpoint(root.string()).ok()) << "round " << round;
    CheckpointReader reader(root.string());
    const std::int64_t it = reader.metadata().state.iteration;
    ASSERT_EQ(reader.metadata().state.consumed_samples, it * 8);
    const TrainingTensors loaded = reader.read_global();
    for (const auto& [name, t] : state_of(c, it).params) ASSERT_EQ(loaded.params.at(name).bytes, t.bytes) << name;
    ++checked;
  }
  // A later save (a resumed run) cleans the unfinished folders and commits.
  save_checkpoint(root.string(), c, kLayout, state_of(c, 999999), {.iteration = 999999});
  for (const auto& n : dlm::test::names_in(root)) EXPECT_FALSE(n.ends_with(".tmp")) << n;
  EXPECT_EQ(CheckpointReader(root.string()).metadata().state.iteration, 999999);
  std::printf("checkpoint: 50 kills over %.3f s saves: %d left a *.tmp, %d checkpoints validated and loaded\n",
              save_us / 1e6, with_tmp, checked);
  EXPECT_GE(checked, 30);
}

TEST(CheckpointReliability, FullDiskIsAnErrorAndLeavesNoCheckpoint) {
  const auto root = test::fresh_dir("full") / "ckpt";
  const auto msg = root.parent_path() / "message";
  const ModelConfig c = test::small_config();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit r{16 << 10, 16 << 10};
    ::setrlimit(RLIMIT_FSIZE, &r);
    try {
      save_checkpoint(root.string(), c, kLayout, state_of(c, 1), {.iteration = 1});
    } catch (const dlm::Error& e) {
      std::ofstream(msg) << e.what();
      ::_exit(1);
    } catch (...) {
      ::_exit(4);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 1);
  const std::string m = dlm::test::read_all(msg);
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_NE(m.find(root.string()), std::string::npos) << m;
  EXPECT_TRUE(dlm::test::names_in(root).empty()) << dlm::test::names_in(root).front();
}

TEST(CheckpointReliability, LatestSymlinkPlantedIsReplacedNotFollowed) {
  const auto dir = test::fresh_dir("link");
  const auto root = dir / "ckpt";
  fs::create_directories(root);
  std::ofstream(dir / "victim") << "precious";
  fs::create_symlink(dir / "victim", root / "latest");
  const ModelConfig c = test::small_config();
  save_checkpoint(root.string(), c, kLayout, state_of(c, 3), {.iteration = 3});
  EXPECT_EQ(dlm::test::read_all(dir / "victim"), "precious");
  EXPECT_FALSE(fs::is_symlink(root / "latest"));
  EXPECT_EQ(CheckpointReader(root.string()).metadata().state.iteration, 3);
}

TEST(CheckpointReliability, NamesInMetadataNeverLeaveTheFolder) {
  const auto root = test::fresh_dir("names") / "ckpt";
  const ModelConfig c = test::small_config();
  const std::string dir = save_checkpoint(root.string(), c, kLayout, state_of(c, 2), {.iteration = 2});
  const std::string text = dlm::test::read_all(fs::path(dir) / "metadata.json");
  const std::regex shard("\"file\": *\"[^\"]+\"");
  for (const std::string bad : {"../rank_00_00.h5", "/tmp/rank_00_00.h5", "..", "sub/../../x.h5", "model.h5"}) {
    const std::string edited = std::regex_replace(text, shard, "\"file\": \"" + bad + "\"", std::regex_constants::format_first_only);
    ASSERT_NE(edited, text);
    try {
      (void)metadata_from_json(edited, "metadata.json");
      ADD_FAILURE() << "accepted shard file " << bad;
    } catch (const dlm::Error& e) {
      EXPECT_NE(std::string(e.what()).find("metadata.json"), std::string::npos) << e.what();
    }
  }
  // `latest` naming a folder outside the root.
  std::ofstream(root / "latest", std::ios::trunc) << "../elsewhere";
  EXPECT_THROW((void)resolve_checkpoint(root.string()), dlm::Error);
}

}  // namespace
