// The hardened checkpoint cases against the real tools: FIFOs named like checkpoint files (they used to block
// dlm-ckpt and dlm-generate forever), a conversion into its own input, and the symlink rule (files of a
// checkpoint may be symlinks to anywhere, as the Hugging Face cache is; names in an index or metadata.json
// may not leave the folder).
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <limits>

#include <gtest/gtest.h>

#include "child.h"
#include "dlm/ckpt/checkpoint.h"
#include "dlm/ckpt/hf.h"
#include "dlm/ckpt/tools.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace dlm::ckpt;

namespace {

const std::string kCkpt = DLM_CKPT_TOOL;
const std::string kGenerate = DLM_GENERATE_TOOL;

// Runs argv; a child still running after 20 s is killed and reported as hung (exit_code -1, signal 9).
dlm::test::ChildResult run_or_hang(const std::vector<std::string>& argv, const std::string& err) {
  const pid_t pid = dlm::test::spawn(argv, err);
  if (!dlm::test::exit_time_before(pid, std::chrono::steady_clock::now() + std::chrono::seconds(20))) ::kill(pid, SIGKILL);
  return dlm::test::wait_child(pid, err);
}

// dlm-ckpt validate reports on stdout; the child helpers keep stderr only.
std::vector<std::string> validate_argv(const fs::path& dir) {
  return {"/bin/sh", "-c", "exec \"$0\" validate \"$1\" 1>&2", kCkpt, dir.string()};
}

std::vector<std::string> generate_argv(const fs::path& load) {
  return {kGenerate, "--load", load.string(), "--tokenizer-type", "NullTokenizer", "--vocab-size", "300",
          "--tokenizer-model", "none", "--prompt", "1 2 3", "--max-new-tokens", "2", "--threads", "1", "--device", "cpu"};
}

using CkptHardening = test::SmallHfFolderTest;

// Case 7.
TEST_F(CkptHardening, FifoNamedLikeACheckpointFileIsRefusedNotWaitedOn) {
  for (const std::string name : {"config.json", "model.safetensors"}) {
    const fs::path hf = dir_ / ("fifo_" + name);
    fs::create_directories(hf);
    for (const auto& e : fs::directory_iterator(dir_ / "hf")) fs::copy(e.path(), hf / e.path().filename());
    fs::remove(hf / name);
    ASSERT_EQ(::mkfifo((hf / name).c_str(), 0644), 0);
    const std::string err = (dir_ / "err").string();
    for (const auto& argv : {validate_argv(hf),
                             std::vector<std::string>{kCkpt, "convert", "--from", "hf", "--to", "native", hf.string(),
                                                      (dir_ / "out").string()},
                             generate_argv(hf)}) {
      const auto r = run_or_hang(argv, err);
      EXPECT_EQ(r.signal, 0) << argv[0] << " " << argv[1] << " hung on a FIFO named " << name;
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_NE(r.err.find((hf / name).string() + ": not a regular file"), std::string::npos) << r.err;
    }
  }
}

// Case 12.
TEST_F(CkptHardening, ConvertIntoItsOwnInputIsAUsageError) {
  const std::string native = (dir_ / "native").string();
  save_checkpoint(native, config_, {}, {test::random_model(config_, 7), {}, {}}, {});
  const auto before = dlm::test::names_in(native);
  const std::string err = (dir_ / "err").string();
  for (const auto& out : {native, native + "/", native + "/hf_out"}) {
    const auto r = dlm::test::run({kCkpt, "convert", "--from", "native", "--to", "hf", native, out}, err);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("overlaps IN"), std::string::npos) << r.err;
  }
  const auto r = dlm::test::run({kCkpt, "convert", "--from", "hf", "--to", "native", (dir_ / "hf").string(),
                                 (dir_ / "hf" / "native").string()}, err);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(dlm::test::names_in(native), before);
  EXPECT_FALSE(fs::exists(dir_ / "hf" / "native"));
}

// Case 13, the rule: a checkpoint's files may be symlinks leaving its folder (the Hugging Face cache's
// snapshots/<rev>/model.safetensors -> ../../blobs/<sha>, a rank .h5 on another disk); they are read when
// they resolve to regular files. docs/reliability.md states the rule.
TEST_F(CkptHardening, SymlinksLeavingTheFolderAreFollowedAsInTheHuggingFaceCache) {
  const fs::path snapshot = dir_ / "hub" / "snapshots" / "abc", blobs = dir_ / "hub" / "blobs";
  fs::create_directories(snapshot);
  fs::create_directories(blobs);
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "hf")) {
    const fs::path blob = blobs / ("blob" + std::to_string(n++));
    fs::copy_file(e.path(), blob);
    fs::create_symlink(fs::path("../../blobs") / blob.filename(), snapshot / e.path().filename());
  }
  const std::string err = (dir_ / "err").string();
  auto r = dlm::test::run({kCkpt, "validate", snapshot.string()}, err);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = dlm::test::run({kCkpt, "convert", "--from", "hf", "--to", "native", snapshot.string(), (dir_ / "native").string()}, err);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // A native checkpoint whose rank file and iteration folder are symlinks to another folder.
  const fs::path iter = fs::path(resolve_checkpoint((dir_ / "native").string()));
  fs::rename(iter / "rank_tp00_pp00.h5", dir_ / "elsewhere.h5");
  fs::create_symlink(dir_ / "elsewhere.h5", iter / "rank_tp00_pp00.h5");
  fs::rename(iter, dir_ / "moved_iter");
  fs::create_symlink(dir_ / "moved_iter", iter);
  r = dlm::test::run({kCkpt, "validate", (dir_ / "native").string()}, err);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // A symlink to something that is not a regular file is still refused.
  fs::remove(iter / "rank_tp00_pp00.h5");
  fs::create_symlink("/dev/zero", iter / "rank_tp00_pp00.h5");
  r = dlm::test::run(validate_argv(dir_ / "native"), err);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("not a regular file"), std::string::npos) << r.err;
}

// Case 10: NaN weights are refused by a conversion (validate flags them) and by generation (it printed
// literal mask tokens and exited 0).
TEST_F(CkptHardening, NanWeightsAreRefusedByConvertAndGenerate) {
  TensorSet model = test::random_model(config_, 7);
  model.at("decoder.final_layernorm.weight").f32()[3] = std::numeric_limits<float>::quiet_NaN();
  const fs::path hf = dir_ / "nan_hf";
  export_hf_folder(hf.string(), config_, model);
  const std::string err = (dir_ / "err").string();
  auto r = dlm::test::run({kCkpt, "convert", "--from", "hf", "--to", "native", hf.string(), (dir_ / "out").string()}, err);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err, "dlm-ckpt: " + hf.string() + ": tensor 'decoder.final_layernorm.weight' holds 1 NaN/Inf values "
                   "(dlm-ckpt validate lists them); nothing written\n");
  EXPECT_FALSE(fs::exists(dir_ / "out" / "latest"));
  for (const std::string mode : {"diffusion", "ar"}) {
    auto argv = generate_argv(hf);
    for (const std::string a : {"--mode", mode.c_str(), "--mask-token", "299"}) argv.push_back(a);
    r = run_or_hang(argv, err);
    EXPECT_EQ(r.exit_code, 1) << mode << ": " << r.err;
    EXPECT_NE(r.err.find("is NaN (NaN weights?"), std::string::npos) << mode << ": " << r.err;
  }
}

}  // namespace
