// The pipeline with a byte tokenizer: Megatron's encode rules, order independent of workers and block
// size, partitions, and failures that leave nothing behind.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "dlm/data/indexed_dataset.h"
#include "dlm/data/preprocess.h"
#include "test_tokenizer.h"

namespace dlm::data {
namespace {

namespace fs = std::filesystem;
using testing::ByteTokenizer;

TEST(EncodeDocument, FollowsMegatronsEncoder) {
  ByteTokenizer tok;
  std::vector<std::int32_t> tokens, lengths;
  std::vector<std::string_view> sentences{"ab", "", "c"};
  encode_document(tok, sentences, true, tokens, lengths);
  EXPECT_EQ(tokens, (std::vector<std::int32_t>{'a' + 1, 'b' + 1, 'c' + 1, 0}));
  EXPECT_EQ(lengths, (std::vector<std::int32_t>{2, 2}));  // the empty sentence is dropped, eod joins the last
  tokens.clear();
  lengths.clear();
  std::vector<std::string_view> empty{"", ""};
  encode_document(tok, empty, true, tokens, lengths);
  EXPECT_TRUE(tokens.empty());  // no eod for a document without tokens
  EXPECT_TRUE(lengths.empty());
  EXPECT_EQ(output_name("out/x", "text", false), "out/x_text_document");
  EXPECT_EQ(output_name("out/x", "text", true), "out/x_text_sentence");
}

class Pipeline : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dlm_preprocess_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  PreprocessOptions options(const std::string& input, const std::string& out) {
    PreprocessOptions o;
    o.inputs = {input};
    o.output_prefix = (dir_ / out).string();
    o.progress = false;
    return o;
  }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  std::string bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  fs::path dir_;
};

// Random documents of random lengths (some empty), two keys.
std::string corpus(int lines, unsigned seed) {
  std::mt19937 rng(seed);
  std::string text;
  for (int i = 0; i < lines; ++i) {
    std::string body(rng() % 3 == 0 ? 0 : rng() % 300, 'x');
    for (auto& c : body) c = static_cast<char>('a' + rng() % 26);
    text += "{\"text\": \"" + body + "\", \"title\": [\"t" + std::to_string(i) + "\", \"\"]}\n";
  }
  return text;
}

TEST_F(Pipeline, SameBytesForAnyWorkerCountAndBlockSize) {
  std::string input = write("in.jsonl", corpus(3000, 7));
  ByteTokenizer tok;
  std::string reference_bin, reference_idx;
  for (std::size_t workers : {1, 2, 8}) {
    for (std::size_t block : {std::size_t{100}, std::size_t{1} << 20}) {
      auto o = options(input, "w" + std::to_string(workers) + "_" + std::to_string(block));
      o.json_keys = {"text", "title"};
      o.append_eod = true;
      o.workers = workers;
      o.block_bytes = block;
      PreprocessSummary s = preprocess_jsonl(o, tok);
      EXPECT_EQ(s.documents, 3000u);
      ASSERT_EQ(s.outputs.size(), 2u);
      EXPECT_EQ(s.outputs[1].documents, 3000u);
      EXPECT_EQ(s.outputs[1].sequences, 3000u);  // "" dropped from each title array
      std::string prefix = s.outputs[0].prefix;
      if (reference_bin.empty()) {
        reference_bin = bytes(bin_path(prefix));
        reference_idx = bytes(idx_path(prefix));
        IndexedDataset ds(prefix);
        ds.validate();
        EXPECT_EQ(ds.dtype(), DType::kUInt16);
        EXPECT_EQ(ds.num_documents(), 3000u);
        EXPECT_LT(ds.num_sequences(), 3000u);  // empty texts make documents without sequences
      } else {
        EXPECT_EQ(bytes(bin_path(prefix)), reference_bin) << workers << " workers, block " << block;
        EXPECT_EQ(bytes(idx_path(prefix)), reference_idx) << workers << " workers, block " << block;
      }
    }
  }
}

TEST_F(Pipeline, PartitionsDealLinesRoundRobinAsMegatron) {
  std::string text;
  for (int i = 0; i < 10; ++i) text += "{\"text\": \"" + std::string(static_cast<std::size_t>(i + 1), 'a') + "\"}\n";
  std::string input = write("in.jsonl", text);
  ByteTokenizer tok;
  auto o = options(input, "p");
  o.partitions = 3;
  o.workers = 2;
  o.block_bytes = 64;
  preprocess_jsonl(o, tok);
  IndexedDataset ds((dir_ / "p_text_document").string());
  std::vector<std::size_t> lengths;
  for (std::size_t i = 0; i < ds.num_sequences(); ++i) lengths.push_back(ds.sequence(i).size());
  // Partition 0 holds lines 0,3,6,9; partition 1 lines 1,4,7; partition 2 lines 2,5,8.
  EXPECT_EQ(lengths, (std::vector<std::size_t>{1, 4, 7, 10, 2, 5, 8, 3, 6, 9}));
  EXPECT_EQ(files(), (std::vector<std::string>{"in.jsonl", "p_text_document.bin", "p_text_document.idx"}));
  o.keep_sequential_samples = true;
  o.output_prefix = (dir_ / "s").string();
  preprocess_jsonl(o, tok);
  IndexedDataset seq((dir_ / "s_text_document").string());
  EXPECT_EQ(seq.sequence(1).size(), 2u);
}

TEST_F(Pipeline, BadLineStopsTheRunAndLeavesNoOutput) {
  std::string text = corpus(2000, 3);
  std::size_t cut = 0;
  for (int i = 0; i < 1500; ++i) cut = text.find('\n', cut) + 1;
  text.insert(cut, "{\"text\": 5}\n");  // line 1501
  std::string input = write("in.jsonl", text);
  ByteTokenizer tok;
  for (std::size_t workers : {1, 4}) {
    auto o = options(input, "bad");
    o.json_keys = {"text", "title"};
    o.workers = workers;
    o.block_bytes = 500;
    try {
      preprocess_jsonl(o, tok);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                input + ":1501: key \"text\": expected a string or an array of strings, found a number");
    }
    EXPECT_EQ(files(), std::vector<std::string>{"in.jsonl"});
  }
}

TEST_F(Pipeline, SkipInvalidCountsAndNamesTheFirst) {
  std::string input = write("in.jsonl", "{\"text\": \"ok\"}\nnot json\n{\"body\": \"x\"}\n{\"text\": \"fine\"}\n");
  ByteTokenizer tok;
  auto o = options(input, "skip");
  o.skip_invalid = true;
  PreprocessSummary s = preprocess_jsonl(o, tok);
  EXPECT_EQ(s.documents, 2u);
  EXPECT_EQ(s.skipped_lines, 2u);
  ASSERT_EQ(s.first_skipped.size(), 2u);
  EXPECT_EQ(s.first_skipped[1], input + ":3: missing key \"text\": expected it in every JSON object");
  EXPECT_NE(format_summary(s).find("skipped 2 invalid lines"), std::string::npos);
  IndexedDataset ds(s.outputs[0].prefix);
  EXPECT_EQ(ds.document(1), (std::vector<std::int32_t>{'f' + 1, 'i' + 1, 'n' + 1, 'e' + 1}));
}

TEST_F(Pipeline, SplitSentencesNeedsPreSplitInput) {
  std::string input = write("in.jsonl", "{\"text\": [\"One.\", \"Two.\"]}\n{\"text\": \"Not split.\"}\n");
  ByteTokenizer tok;
  auto o = options(input, "ss");
  o.split_sentences = true;
  try {
    preprocess_jsonl(o, tok);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.where().line, 2u);
    EXPECT_NE(e.message().find("does not split text itself"), std::string::npos);
  }
  EXPECT_EQ(files(), std::vector<std::string>{"in.jsonl"});
}

}  // namespace
}  // namespace dlm::data
