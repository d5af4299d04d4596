// JSON field extraction and line blocks (plain and zstd).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <zstd.h>

#include "dlm/common/error.h"
#include "dlm/data/jsonl.h"

namespace dlm::data {
namespace {

namespace fs = std::filesystem;

// Reads one line with the padding simdjson needs behind it.
std::string read_line(JsonFieldReader& reader, const std::string& line) {
  std::string padded = line + std::string(json_padding(), ' ');
  return reader.read(padded.data(), line.size());
}

TEST(JsonFieldReader, ReadsStringsArraysAndEscapes) {
  JsonFieldReader reader({"text", "title"});
  ASSERT_EQ(read_line(reader, R"({"id": 3, "title": ["a", "b\n"], "text": "caf\u00e9 \"q\"", "x": {"y": [1, 2.5e3, null]}})"), "");
  EXPECT_FALSE(reader.fields()[0].is_array);
  ASSERT_EQ(reader.fields()[0].parts.size(), 1u);
  EXPECT_EQ(reader.fields()[0].parts[0], "caf\xc3\xa9 \"q\"");
  EXPECT_TRUE(reader.fields()[1].is_array);
  ASSERT_EQ(reader.fields()[1].parts.size(), 2u);
  EXPECT_EQ(reader.fields()[1].parts[1], "b\n");
}

TEST(JsonFieldReader, DuplicateKeyTakesTheLastValueAsPython) {
  JsonFieldReader reader({"text"});
  ASSERT_EQ(read_line(reader, R"({"text": "first", "text": "second"})"), "");
  EXPECT_EQ(reader.fields()[0].parts.at(0), "second");
}

TEST(JsonFieldReader, SaysWhatWasExpected) {
  JsonFieldReader reader({"text"});
  EXPECT_EQ(read_line(reader, R"({"body": "x"})"), "missing key \"text\": expected it in every JSON object");
  EXPECT_EQ(read_line(reader, R"({"text": 12})"), "key \"text\": expected a string or an array of strings, found a number");
  EXPECT_EQ(read_line(reader, R"({"text": ["a", null]})"),
            "key \"text\": expected a string or an array of strings, found an array holding null");
  EXPECT_EQ(read_line(reader, R"(["text"])"), "expected a JSON object, found an array");
  EXPECT_EQ(read_line(reader, ""), "expected a JSON object, found an empty line");
  EXPECT_EQ(read_line(reader, "{\"text\": \"\xff\xfe\"}"), "invalid UTF-8: expected UTF-8 text");
  EXPECT_EQ(read_line(reader, R"({"text": "a"} {"text": "b"})"), "invalid JSON: expected the line to end after its object");
  EXPECT_NE(read_line(reader, R"({"text": "a")"), "");
  EXPECT_NE(read_line(reader, R"({"text": "a", })"), "");
  // Malformed JSON inside a value that is not asked for is still an error, as for json.loads.
  EXPECT_NE(read_line(reader, R"({"other": [1, , 2], "text": "a"})"), "");
  EXPECT_NE(read_line(reader, R"({"other": {"k" 1}, "text": "a"})"), "");
  EXPECT_NE(read_line(reader, R"({"other": tru, "text": "a"})"), "");
  EXPECT_EQ(read_line(reader, R"({"text": "a"})"), "");
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dlm_jsonl_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  fs::path dir_;
};

std::string zstd_compress(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3));
  return out;
}

// Every line with its line number, reading with blocks of `block_bytes`.
std::vector<std::pair<std::uint64_t, std::string>> all_lines(const std::vector<std::string>& files,
                                                             std::size_t block_bytes) {
  LineBlockReader reader(files, block_bytes);
  LineBlock block;
  std::vector<std::pair<std::uint64_t, std::string>> lines;
  while (reader.next(block)) {
    EXPECT_GE(block.bytes.size(), block.used + json_padding());
    std::string text(block.bytes.data(), block.used);
    std::uint64_t line = block.first_line;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      lines.emplace_back(line++, text.substr(pos, nl - pos));
      pos = nl + 1;
    }
  }
  return lines;
}

TEST_F(TempDir, BlocksHoldWholeLinesWithTheirNumbers) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += std::string(static_cast<std::size_t>(i % 37), 'a' + i % 26) + "\n";
  text += "last line without newline";
  std::string plain = write("a.jsonl", text);
  std::string zst = write("b.jsonl.zst", zstd_compress(text) + zstd_compress("second frame\n"));
  for (std::size_t block : {64, 100, 1 << 20}) {
    auto lines = all_lines({plain, zst}, block);
    ASSERT_EQ(lines.size(), 402u) << block;
    EXPECT_EQ(lines[0], std::make_pair(std::uint64_t{1}, std::string()));
    EXPECT_EQ(lines[5].second, "fffff");
    EXPECT_EQ(lines[200], std::make_pair(std::uint64_t{201}, std::string("last line without newline")));
    EXPECT_EQ(lines[201].first, 1u);  // the second file counts from 1 again
    // The second frame continues the first one's text: frames are one stream.
    EXPECT_EQ(lines[401], std::make_pair(std::uint64_t{201}, std::string("last line without newlinesecond frame")));
  }
}

TEST_F(TempDir, TruncatedAndCorruptZstdAreErrors) {
  std::string text(100000, 'x');
  std::string packed = zstd_compress(text + "\n");
  std::string truncated = write("t.zst", packed.substr(0, packed.size() - 5));
  try {
    all_lines({truncated}, 1 << 16);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "truncated .zst: the input ends inside a frame");
    EXPECT_EQ(e.where().file, truncated);
  }
  std::string not_zstd = write("n.zst", "{\"text\": \"plain\"}\n");
  EXPECT_THROW(all_lines({not_zstd}, 1 << 16), Error);
}

TEST_F(TempDir, ExpandsFoldersAndGlobsSorted) {
  write("b.jsonl", "");
  write("a.json", "");
  write("c.jsonl.zst", "");
  write("notes.txt", "");
  auto from_folder = expand_inputs({dir_.string()});
  ASSERT_EQ(from_folder.size(), 3u);
  EXPECT_EQ(fs::path(from_folder[0]).filename(), "a.json");
  EXPECT_EQ(fs::path(from_folder[2]).filename(), "c.jsonl.zst");
  auto from_glob = expand_inputs({(dir_ / "*.jsonl").string()});
  ASSERT_EQ(from_glob.size(), 1u);
  EXPECT_THROW(expand_inputs({(dir_ / "missing.jsonl").string()}), Error);
  EXPECT_THROW(expand_inputs({(dir_ / "*.parquet").string()}), Error);
}

}  // namespace
}  // namespace dlm::data
