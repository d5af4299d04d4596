// Inputs the libFuzzer targets found crashing (tests/fuzz/), each now a one-line dlm::Error naming the file.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "dlm/data/tokenizer.h"

namespace {

std::string write(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("dlm_fuzz_regression_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

// gpt2_fuzz: a vocab.json that is one number beyond double's range made nlohmann throw out_of_range (406),
// which escaped as an uncaught exception.
TEST(FuzzRegression, Gpt2VocabWithAnOverflowingNumberIsAnError) {
  dlm::data::TokenizerOptions o;
  o.type = "GPT2BPETokenizer";
  o.vocab_file = write("vocab.json", "-" + std::string(320, '7'));
  o.merge_file = write("merges.txt", "");
  try {
    dlm::data::make_tokenizer(o);
    FAIL() << "an overflowing number is not a vocabulary";
  } catch (const dlm::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(o.vocab_file), std::string::npos) << m;
    EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

// sentencepiece_fuzz: a .model whose piece is empty made libsentencepiece throw (Darts: "zero-length key")
// out of Load instead of returning a status.
TEST(FuzzRegression, SentencePieceModelWithAnEmptyPieceIsAnError) {
  static const char kModel[] = "\x0a\x0e\x0a\x05\x6e\x3e\x00\x15\x6b\x75\x3c\x00\x00\x00\x18\x02\x0a\x0c\x0a\x03\x00\x00\x73\x15\x00\x00\x00\x00\x18\x0a";
  dlm::data::TokenizerOptions o;
  o.type = "SentencePieceTokenizer";
  o.model = write("sp.model", std::string(kModel, sizeof(kModel) - 1));
  try {
    dlm::data::make_tokenizer(o);
    FAIL() << "a model with an empty piece loaded";
  } catch (const dlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find(o.model + ": not a SentencePiece model"), std::string::npos) << e.what();
  }
}

}  // namespace
