// A tiny tokenized corpus and the command lines that train on it, shared by the dlm-train and
// dlm-generate tool tests.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "child.h"
#include "dlm/data/indexed_dataset.h"

namespace dlm::test {

inline const std::string kTrainTool = DLM_TRAIN_TOOL;
inline const std::string kGenerateTool = DLM_GENERATE_TOOL;
inline const std::string kCkptTool = DLM_CKPT_TOOL;

// 300 documents of a repetitive toy language over ids 1..198 (eod 0): learnable, so losses move.
inline void write_corpus(const std::string& prefix) {
  data::IndexedDatasetWriter w(prefix, data::DType::kUInt16);
  std::mt19937 rng(5);
  for (int d = 0; d < 300; ++d) {
    std::vector<std::int32_t> doc;
    const int start = 1 + static_cast<int>(rng() % 150), len = 20 + static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) doc.push_back(start + (i * 7 + static_cast<int>(rng() % 3)) % 48);
    doc.push_back(0);
    w.add_item(doc);
    w.end_document();
  }
  w.finalize();
}

class ToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dlm-tool-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "-" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    prefix_ = (dir_ / "corpus_text_document").string();
    write_corpus(prefix_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A 2-layer diffusion model over the corpus; `extra` overrides or adds flags. A log line per iteration and no
  // evaluation (--eval-iters 0), where Megatron's defaults are 100 and an evaluation of 100 batches every 1000.
  std::vector<std::string> train_argv(std::vector<std::string> extra) const {
    std::vector<std::string> a = {kTrainTool, "--num-layers", "2", "--hidden-size", "32", "--ffn-hidden-size", "64",
                                  "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2",
                                  "--global-batch-size", "4", "--lr", "3e-3", "--vocab-size", "200", "--mask-token",
                                  "199", "--data-path", prefix_, "--split", "90,10,0", "--data-cache-path",
                                  (dir_ / "cache").string(), "--threads", "1", "--log-interval", "1", "--seed", "7",
                                  "--device", "cpu", "--eval-iters", "0"};
    // A flag of `extra` replaces the default's value (the tool, as Megatron's argparse, would let the last
    // occurrence win too; replacing keeps the command lines short to read in a failure).
    for (std::size_t i = 0; i < extra.size(); ++i) {
      const bool has_value = i + 1 < extra.size() && extra[i + 1].rfind("--", 0) != 0;
      auto at = std::find(a.begin() + 1, a.end(), extra[i]);
      if (at != a.end() && has_value) {
        *(at + 1) = extra[++i];
      } else {
        a.push_back(extra[i]);
        if (has_value) a.push_back(extra[++i]);
      }
    }
    return a;
  }
  ChildResult run(const std::vector<std::string>& argv) const { return dlm::test::run(argv, (dir_ / "err").string()); }
  // The same with stdout kept in `out` (through /bin/sh; the words are single-quoted).
  ChildResult run_keeping_stdout(const std::vector<std::string>& argv, const std::filesystem::path& out) const {
    std::string command = "exec";
    for (const auto& a : argv) command += " '" + a + "'";
    return run({"/bin/sh", "-c", command + " > '" + out.string() + "'"});
  }

  // The `name` field of each line of a metrics file that has one, as written (shortest round-trip decimal).
  static std::vector<std::string> metric(const std::filesystem::path& metrics, const std::string& name) {
    std::vector<std::string> out;
    std::ifstream in(metrics);
    const std::string key = "\"" + name + "\": ";
    for (std::string line; std::getline(in, line);) {
      const auto at = line.find(key);
      if (at == std::string::npos) continue;
      const auto end = line.find_first_of(",}", at);
      out.push_back(line.substr(at + key.size(), end - at - key.size()));
    }
    return out;
  }
  static std::vector<std::string> losses(const std::filesystem::path& metrics) { return metric(metrics, "loss"); }

  std::filesystem::path dir_;
  std::string prefix_;
};

// The run failed with an exit code, and its error is the last line of stderr, one line naming the tool
// (progress lines may come before it).
inline std::string last_error_line(const ChildResult& r, const std::string& tool) {
  if (r.exit_code <= 0 || r.signal != 0 || r.err.empty() || r.err.back() != '\n') return "";
  const auto start = r.err.rfind('\n', r.err.size() - 2);
  const std::string line = r.err.substr(start == std::string::npos ? 0 : start + 1);
  return line.rfind(tool + ": ", 0) == 0 ? line.substr(0, line.size() - 1) : "";
}

}  // namespace dlm::test
