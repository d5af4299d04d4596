// dlm-ckpt convert as a user runs it: SIGKILL at 50 random instants of an HF -> native conversion, a full
// disk during an export to HF, a symlink planted at an HF output file, and HF folders whose index or
// files point outside the folder.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "child.h"
#include "dlm/ckpt/checkpoint.h"
#include "dlm/ckpt/hf.h"
#include "dlm/ckpt/tools.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace dlm::ckpt;

namespace {

const std::string kTool = DLM_CKPT_TOOL;

bool one_line_error(const dlm::test::ChildResult& r) {
  return r.exit_code == 1 && r.err.starts_with("dlm-ckpt: ") && std::count(r.err.begin(), r.err.end(), '\n') == 1;
}

using CkptTool = test::SmallHfFolderTest;

TEST_F(CkptTool, SigkillDuringConvertLeavesNoLatestOrAValidCheckpoint) {
  const std::vector<std::string> argv{kTool, "convert", "--from", "hf", "--to", "native", "--tp", "2",
                                      (dir_ / "hf").string(), (dir_ / "out").string()};
  const auto err = (dir_ / "err").string();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(dlm::test::run(argv, err).exit_code, 0);
  const long run_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  const TensorSet expect = CheckpointReader((dir_ / "out").string()).read_global(false).params;
  std::mt19937 rng(51);
  std::uniform_int_distribution<long> delay_us(0, run_us * 3 / 2);
  int absent = 0, complete = 0;
  for (int round = 0; round < 50; ++round) {
    fs::remove_all(dir_ / "out");
    const pid_t pid = dlm::test::spawn(argv, err);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ::kill(pid, SIGKILL);
    (void)dlm::test::wait_child(pid, err);
    if (!fs::exists(dir_ / "out" / "latest")) {
      ++absent;
    } else {
      ASSERT_TRUE(validate_checkpoint((dir_ / "out").string()).ok()) << "round " << round;
      const TensorSet got = CheckpointReader((dir_ / "out").string()).read_global(false).params;
      for (const auto& [name, t] : expect) ASSERT_EQ(got.at(name).bytes, t.bytes) << name;
      ++complete;
    }
    if (round % 10 == 0) {
      // A rerun completes what a kill interrupted; a conversion that was committed is not overwritten.
      const bool committed = fs::exists(dir_ / "out" / "latest");
      const auto again = dlm::test::run(argv, err);
      if (committed) {
        EXPECT_NE(again.err.find("already exists: this iteration was saved before"), std::string::npos) << again.err;
      } else {
        ASSERT_EQ(again.exit_code, 0) << "rerun after round " << round << ": " << again.err;
        ASSERT_TRUE(validate_checkpoint((dir_ / "out").string()).ok()) << "round " << round;
      }
    }
  }
  std::printf("dlm-ckpt convert: 50 kills over %.2f s runs: %d without latest, %d complete and equal\n", run_us / 1e6,
              absent, complete);
  EXPECT_GE(absent, 5);
}

TEST_F(CkptTool, FullDiskDuringExportIsOneLineErrorAndNoOutputFile) {
  const std::string native = (dir_ / "native").string();
  save_checkpoint(native, config_, {}, {test::random_model(config_, 7), {}, {}}, {});
  const auto r = dlm::test::run({kTool, "convert", "--from", "native", "--to", "hf", native, (dir_ / "out").string()},
                                (dir_ / "err").string(), 8 << 10);
  EXPECT_TRUE(one_line_error(r)) << r.exit_code << ": " << r.err;
  for (const auto& n : dlm::test::names_in(dir_ / "out")) ADD_FAILURE() << "left behind: " << n;
}

TEST_F(CkptTool, SymlinkPlantedAtAnHfOutputIsReplacedNotFollowed) {
  const std::string native = (dir_ / "native").string();
  save_checkpoint(native, config_, {}, {test::random_model(config_, 7), {}, {}}, {});
  fs::create_directories(dir_ / "out");
  std::ofstream(dir_ / "victim") << "precious";
  fs::create_symlink(dir_ / "victim", dir_ / "out" / "config.json");
  fs::create_symlink(dir_ / "victim", dir_ / "out" / "model.safetensors");
  const auto r = dlm::test::run({kTool, "convert", "--from", "native", "--to", "hf", native, (dir_ / "out").string()},
                                (dir_ / "err").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(dlm::test::read_all(dir_ / "victim"), "precious");
  EXPECT_FALSE(fs::is_symlink(dir_ / "out" / "config.json"));
  EXPECT_FALSE(fs::is_symlink(dir_ / "out" / "model.safetensors"));
}

TEST_F(CkptTool, HfIndexNamingAFileOutsideTheFolderIsRefused) {
  const fs::path hf = dir_ / "hf";
  fs::rename(hf / "model.safetensors", dir_ / "outside.safetensors");
  for (const std::string& bad : std::vector<std::string>{"../outside.safetensors", (dir_ / "outside.safetensors").string()}) {
    std::string map;
    for (const TensorSpec& s : model_tensors(config_)) map += (map.empty() ? "" : ",") + ("\"" + s.name + "\": \"" + bad + "\"");
    std::ofstream(hf / "model.safetensors.index.json", std::ios::trunc) << "{\"weight_map\": {" << map << "}}";
    const auto r = dlm::test::run({kTool, "convert", "--from", "hf", "--to", "native", hf.string(), (dir_ / "o").string()},
                                  (dir_ / "err").string());
    EXPECT_TRUE(one_line_error(r)) << bad << ": " << r.exit_code << ": " << r.err;
    EXPECT_NE(r.err.find("model.safetensors.index.json"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "o" / "latest"));
  }
}

TEST_F(CkptTool, MissingInputAndUnwritableOutputAreOneLineErrors) {
  auto r = dlm::test::run({kTool, "convert", "--from", "hf", "--to", "native", (dir_ / "nope").string(), (dir_ / "o").string()},
                          (dir_ / "err").string());
  EXPECT_TRUE(one_line_error(r)) << r.exit_code << ": " << r.err;
  std::ofstream(dir_ / "file") << "x";  // an output "folder" under a regular file
  r = dlm::test::run({kTool, "convert", "--from", "hf", "--to", "native", (dir_ / "hf").string(), (dir_ / "file" / "o").string()},
                     (dir_ / "err").string());
  EXPECT_TRUE(one_line_error(r)) << r.exit_code << ": " << r.err;
}

}  // namespace
