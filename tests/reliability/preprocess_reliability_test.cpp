// dlm-preprocess as a user runs it: SIGKILL at 50 random instants, a full disk, a symlink planted at the
// output. Its outputs are PREFIX_text_document.{bin,idx}; either they are absent or they are the complete
// dataset, byte for byte the one an uninterrupted run writes.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "child.h"
#include "dlm/data/indexed_dataset.h"

namespace fs = std::filesystem;
using dlm::test::read_all;

namespace {

const std::string kTool = DLM_PREPROCESS_TOOL;
const std::string kTokenizer = std::string(DLM_SOURCE_DIR) + "/tests/fuzz/corpus/tokenizer_json/bytelevel.json";

fs::path fresh(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / ("dlm_rel_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c < 0x20) out += ' ';
    else out += static_cast<char>(c);
  }
  return out + "\"";
}

// Real text: dlm's own sources, one document per file, repeated up to about `bytes`.
fs::path make_corpus(const fs::path& dir, std::size_t bytes) {
  std::vector<std::string> docs;
  for (const auto& e : fs::recursive_directory_iterator(std::string(DLM_SOURCE_DIR) + "/libdata"))
    if (e.is_regular_file() && (e.path().extension() == ".cpp" || e.path().extension() == ".h")) docs.push_back(read_all(e.path()));
  std::sort(docs.begin(), docs.end());
  const fs::path path = dir / "corpus.jsonl";
  std::ofstream out(path, std::ios::binary);
  std::size_t written = 0;
  for (std::size_t i = 0; written < bytes; ++i) {
    const std::string line = "{\"text\": " + json_string(docs[i % docs.size()]) + "}\n";
    out << line;
    written += line.size();
  }
  return path;
}

std::vector<std::string> argv_for(const fs::path& input, const fs::path& prefix) {
  return {kTool, "--input", input.string(), "--output-prefix", prefix.string(), "--json-keys", "text",
          "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", kTokenizer, "--workers", "2"};
}

struct Outputs {
  fs::path bin, idx;
  explicit Outputs(const fs::path& prefix)
      : bin(prefix.string() + "_text_document.bin"), idx(prefix.string() + "_text_document.idx") {}
};

class Preprocess : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh("pre");
    corpus_ = make_corpus(dir_, 3 << 20);
    const fs::path ref = dir_ / "ref";
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = dlm::test::run(argv_for(corpus_, ref), (dir_ / "ref.err").string());
    run_us_ = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ref_bin_ = read_all(Outputs(ref).bin);
    ref_idx_ = read_all(Outputs(ref).idx);
    ASSERT_GT(ref_bin_.size(), 100000u);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_, corpus_;
  long run_us_ = 0;
  std::string ref_bin_, ref_idx_;
};

TEST_F(Preprocess, SigkillAt50RandomInstantsLeavesNothingOrTheCompleteDataset) {
  std::mt19937 rng(20261122);
  std::uniform_int_distribution<long> delay_us(0, run_us_ * 2);
  int absent = 0, complete = 0, bin_only = 0, temps = 0;
  const fs::path out_dir = dir_ / "kill";
  for (int round = 0; round < 50; ++round) {
    fs::remove_all(out_dir);
    fs::create_directories(out_dir);
    const Outputs o(out_dir / "out");
    const auto err = (dir_ / "kill.err").string();
    const pid_t pid = dlm::test::spawn(argv_for(corpus_, out_dir / "out"), err);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ::kill(pid, SIGKILL);
    const auto r = dlm::test::wait_child(pid, err);
    ASSERT_TRUE(r.signal == SIGKILL || r.exit_code == 0) << r.err;
    for (const auto& n : dlm::test::names_in(out_dir)) temps += n != "out_text_document.bin" && n != "out_text_document.idx";
    if (fs::exists(o.idx)) {
      // .idx is committed after .bin: its presence means a finished dataset, and it must be that one.
      ASSERT_TRUE(fs::exists(o.bin)) << "round " << round;
      ASSERT_EQ(read_all(o.idx), ref_idx_) << "round " << round;
      ASSERT_EQ(read_all(o.bin), ref_bin_) << "round " << round;
      dlm::data::IndexedDataset(out_dir.string() + "/out_text_document").validate();
      ++complete;
    } else if (fs::exists(o.bin)) {
      ++bin_only;  // killed between the two renames: no .idx, so no reader opens it
    } else {
      ++absent;
    }
    // A rerun over whatever the kill left completes and writes the same bytes.
    if (round % 5 == 0) {
      const auto again = dlm::test::run(argv_for(corpus_, out_dir / "out"), err);
      ASSERT_EQ(again.exit_code, 0) << again.err;
      ASSERT_EQ(read_all(o.idx), ref_idx_);
      ASSERT_EQ(read_all(o.bin), ref_bin_);
    }
  }
  std::printf("dlm-preprocess: 50 kills over %.2f s runs: %d absent, %d complete, %d .bin without .idx, %d temp files left\n",
              run_us_ / 1e6, absent, complete, bin_only, temps);
  EXPECT_GE(absent, 5) << "the kills never landed inside a run";
}

TEST_F(Preprocess, FullDiskIsOneLineErrorAndNoOutput) {
  const fs::path out_dir = dir_ / "full";
  fs::create_directories(out_dir);
  const auto r = dlm::test::run(argv_for(corpus_, out_dir / "out"), (dir_ / "full.err").string(), 64 << 10);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(r.err.starts_with("dlm-preprocess: ")) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(dlm::test::names_in(out_dir).empty()) << dlm::test::names_in(out_dir).front();
}

TEST_F(Preprocess, SymlinkPlantedAtTheOutputIsReplacedNotFollowed) {
  const fs::path out_dir = dir_ / "link";
  fs::create_directories(out_dir);
  const fs::path victim = dir_ / "victim";
  std::ofstream(victim) << "precious";
  const Outputs o(out_dir / "out");
  fs::create_symlink(victim, o.bin);
  fs::create_symlink(victim, o.idx);
  const auto r = dlm::test::run(argv_for(corpus_, out_dir / "out"), (dir_ / "link.err").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_all(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(o.bin));
  EXPECT_FALSE(fs::is_symlink(o.idx));
  EXPECT_EQ(read_all(o.bin), ref_bin_);
}

TEST_F(Preprocess, UnwritableOrMissingOutputFolderIsOneLineError) {
  const auto r = dlm::test::run(argv_for(corpus_, dir_ / "no" / "such" / "out"), (dir_ / "bad.err").string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(r.err.starts_with("dlm-preprocess: ")) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "no"));
}

}  // namespace
