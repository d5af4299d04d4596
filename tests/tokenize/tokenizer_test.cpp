// Unit tests: tokenizer kinds on small hand-made files with hand-computed ids, the UTF-8 repair
// rule, the regex translation, the BPE word cache, and one-line errors for malformed files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "../../libdata/tokenize/bpe.h"
#include "../../libdata/tokenize/regex.h"
#include "../../libdata/tokenize/text.h"
#include "dlm/common/error.h"
#include "dlm/data/indexed_dataset.h"
#include "dlm/data/tokenizer.h"

namespace fs = std::filesystem;
using dlm::data::make_tokenizer;
using dlm::data::TokenizerOptions;
using Ids = std::vector<std::int32_t>;

namespace {

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("dlm_tok_test_" + std::to_string(::getpid()) + "_" + std::to_string(n_++))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const auto p = path_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }

 private:
  static inline int n_ = 0;
  fs::path path_;
};

// A byte-level BPE over the letters a, b, space (GPT-2 spells space "Ġ"), with merges
// "a b" (rank 0) -> ab, "Ġ a" (rank 1) -> Ġa, "Ġa b" (rank 2) -> Ġab, plus <|eot|> as id 6.
std::string tiny_byte_level(const std::string& extra_pre = "") {
  return R"({"version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 6, "content": "<|eot|>", "single_word": false, "lstrip": false, "rstrip": false,
                      "normalized": false, "special": true}],
    "normalizer": null,
    "pre_tokenizer": )" + (extra_pre.empty() ? R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})" : extra_pre) + R"(,
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false, "byte_fallback": false,
              "vocab": {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġa": 4, "Ġab": 5, "<|eot|>": 6},
              "merges": ["a b", "Ġ a", "Ġa b"]}})";
}

std::unique_ptr<dlm::data::Tokenizer> hf(const std::string& path) {
  TokenizerOptions o;
  o.type = "HuggingFaceTokenizer";
  o.model = path;
  return make_tokenizer(o);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dlm::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Tokenizer, ByteLevelBpeByHand) {
  TempDir dir;
  const auto t = hf(dir.write("tokenizer.json", tiny_byte_level()));
  EXPECT_EQ(t->encode("ab ab"), (Ids{3, 2, 3}));  // " ab": "a b" (rank 0) wins over "Ġ a"; no "Ġ ab"
  EXPECT_EQ(t->encode("ba a<|eot|>b"), (Ids{1, 0, 4, 6, 1}));
  EXPECT_EQ(t->encode("aab"), (Ids{0, 3}));               // leftmost lowest rank: a(ab)
  EXPECT_EQ(t->decode(Ids{3, 5, 6}), "ab ab<|eot|>");
  EXPECT_EQ(t->vocab_size(), 7u);
  EXPECT_EQ(t->kind(), "HuggingFaceTokenizer");
  EXPECT_FALSE(t->special_ids().eod);  // no tokenizer_config.json: no roles
  EXPECT_THROW(t->eod(), dlm::Error);
  // Bytes with no token are dropped (as `tokenizers` does without an unk token); neighbours then merge.
  EXPECT_EQ(t->encode("azb"), (Ids{3}));
}

TEST(Tokenizer, TokenizerConfigGivesRoles) {
  TempDir dir;
  dir.write("tokenizer.json", tiny_byte_level());
  dir.write("tokenizer_config.json", R"({"eos_token": "<|eot|>", "bos_token": {"content": "<|eot|>"}, "mask_token": "ab"})");
  TokenizerOptions o;
  o.type = "HuggingFaceTokenizer";
  o.model = fs::path(dir.write("x", "")).parent_path().string();
  const auto t = make_tokenizer(o);
  EXPECT_EQ(t->eod(), 6);
  EXPECT_EQ(t->special_ids().bos, 6);
  EXPECT_EQ(t->special_ids().mask, 3);
  o.mask_token = 5;
  EXPECT_EQ(make_tokenizer(o)->special_ids().mask, 5);
  o.mask_token = 10;
  EXPECT_NE(error_of([&] { make_tokenizer(o); }).find("outside the vocabulary"), std::string::npos);
}

TEST(Tokenizer, NullTokenizer) {
  TokenizerOptions o;
  o.type = "NullTokenizer";
  EXPECT_THROW(make_tokenizer(o), dlm::Error);
  o.vocab_size = 100;
  const auto t = make_tokenizer(o);
  EXPECT_EQ(t->encode("5 17 +3 -2 42\n"), (Ids{5, 17, 3, -2, 42}));
  EXPECT_EQ(t->decode(Ids{1, 2}), "1 2");
  EXPECT_EQ(t->eod(), 100);
  EXPECT_EQ(t->vocab_size(), 101u);
  EXPECT_NE(error_of([&] { t->encode("1  2"); }).find("byte 2"), std::string::npos);  // Python: int('') fails
  EXPECT_THROW(t->encode("1 x"), dlm::Error);
}

TEST(Tokenizer, UnknownTypeIsOneLine) {
  TokenizerOptions o;
  o.type = "Bert";
  const auto e = error_of([&] { make_tokenizer(o); });
  EXPECT_NE(e.find("unknown tokenizer type \"Bert\""), std::string::npos);
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(Tokenizer, MalformedTokenizerJson) {
  TempDir dir;
  auto err = [&](const std::string& text) {
    const auto path = dir.write("tokenizer.json", text);
    const auto e = error_of([&] { hf(path); });
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    return e;
  };
  EXPECT_NE(err("{\"model\": ").find("not valid JSON"), std::string::npos);
  EXPECT_NE(err("{\"normalizer\": null}").find("model: missing"), std::string::npos);
  auto replace = [](std::string s, const std::string& from, const std::string& to) {
    return s.replace(s.find(from), from.size(), to);
  };
  const std::string good = tiny_byte_level();
  EXPECT_NE(err(replace(good, "\"type\": \"BPE\"", "\"type\": \"WordPiece\"")).find("unsupported: model.type"),
            std::string::npos);
  EXPECT_NE(err(replace(good, "\"Ġ a\"", "\"Ġ q\"")).find("model.merges[1]: token \"q\" is not in model.vocab"),
            std::string::npos);
  EXPECT_NE(err(replace(good, "\"ab\": 3", "\"ab\": 1")).find("duplicate id 1"), std::string::npos);
  EXPECT_NE(err(replace(good, "\"dropout\": null", "\"dropout\": 0.1")).find("unsupported: model.dropout"),
            std::string::npos);
  EXPECT_NE(err(tiny_byte_level(R"({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}]})"))
                .find("unsupported: pre_tokenizer.pretokenizers[0].type"),
            std::string::npos);
  EXPECT_NE(err(replace(good, "\"single_word\": false", "\"single_word\": true")).find("unsupported: added_tokens[0].single_word"),
            std::string::npos);
  EXPECT_NE(err(replace(good, "\"padding\": null", "\"padding\": {\"strategy\": \"BatchLongest\"}")).find("unsupported: padding"),
            std::string::npos);
  EXPECT_NE(err(replace(good, "\"decoder\": {\"type\": \"ByteLevel\"}", "\"decoder\": {\"type\": \"WordPiece\"}"))
                .find("unsupported: decoder.type"),
            std::string::npos);
}

// ids are dense from 0 (as len(tokenizer) counts them and Megatron sizes the embedding and
// the .bin dtype from it): an id past the file's entries is refused before anything is sized by it (an id of
// 1e8 used to allocate gigabytes), a hole is refused, and the dense vocabulary gives Megatron's uint16.
TEST(Tokenizer, TokenIdsMustBeDense) {
  TempDir dir;
  auto replace = [](std::string s, const std::string& from, const std::string& to) {
    return s.replace(s.find(from), from.size(), to);
  };
  const std::string good = tiny_byte_level();
  const auto huge = dir.write("huge.json", replace(replace(good, "\"<|eot|>\": 6}", "\"<|eot|>\": 100000000}"),
                                                   "\"id\": 6", "\"id\": 100000000"));
  EXPECT_EQ(error_of([&] { hf(huge); }),
            huge + ": model.vocab[\"<|eot|>\"]: id 100000000 is past the 8 entries of model.vocab and added_tokens: "
                   "ids must be dense from 0");
  const auto hole = dir.write("hole.json", replace(replace(good, "\"<|eot|>\": 6}", "\"<|eot|>\": 7}"), "\"id\": 6",
                                                   "\"id\": 7"));
  EXPECT_EQ(error_of([&] { hf(hole); }),
            hole + ": model.vocab: no token has id 6, but ids go up to 7: ids must be dense from 0");
  const auto t = hf(dir.write("tokenizer.json", good));
  EXPECT_EQ(t->vocab_size(), 7u);  // len(tokenizer)
  EXPECT_EQ(dlm::data::optimal_token_dtype(t->vocab_size()), dlm::data::DType::kUInt16);
}

TEST(Tokenizer, Gpt2FilesAndErrors) {
  TempDir dir;
  TokenizerOptions o;
  o.type = "GPT2BPETokenizer";
  o.vocab_file = dir.write("vocab.json", R"({"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġa": 4, "Ġab": 5, "<|endoftext|>": 6})");
  o.merge_file = dir.write("merges.txt", "#version: 0.2\na b\nĠ a\nĠa b\n");
  const auto t = make_tokenizer(o);
  EXPECT_EQ(t->encode("ab ab<|endoftext|>"), (Ids{3, 2, 3, 6}));
  EXPECT_EQ(t->eod(), 6);
  EXPECT_EQ(t->kind(), "GPT2BPETokenizer");
  o.merge_file = dir.write("merges.txt", "#version: 0.2\na b\nĠ x\n");
  const auto e = error_of([&] { make_tokenizer(o); });
  EXPECT_NE(e.find("merges.txt:3: token \"x\""), std::string::npos) << e;
}

TEST(Tokenizer, TikTokenRankFile) {
  TempDir dir;
  // 256 single bytes, then "ab" (rank 256) and " ab" (rank 257); ids are ranks + 10 specials.
  std::string list = "[";
  const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int b = 0; b < 256; ++b) {
    std::string enc = {b64[b >> 2], b64[(b & 3) << 4], '=', '='};
    list += "{\"rank\": " + std::to_string(b) + ", \"token_bytes\": \"" + enc + "\", \"token_str\": \"\"},";
  }
  list += R"({"rank": 256, "token_bytes": "YWI=", "token_str": "ab"}, {"rank": 257, "token_bytes": "IGFi", "token_str": " ab"}])";
  TokenizerOptions o;
  o.type = "TikTokenizer";
  o.model = dir.write("ranks.json", list);
  o.tiktoken_num_special_tokens = 10;
  o.vocab_size = 268;
  const auto t = make_tokenizer(o);
  EXPECT_EQ(t->encode("ab ab</s>x"), (Ids{266, 267, 2, 'x' + 10}));
  EXPECT_EQ(t->decode(Ids{266, 267, 2}), "ab ab</s>");
  EXPECT_EQ(t->eod(), 2);
  EXPECT_EQ(t->special_ids().mask, 3);
  o.vocab_size = 300;
  EXPECT_NE(error_of([&] { make_tokenizer(o); }).find("fewer than"), std::string::npos);
}

TEST(Tokenizer, TruncatedSentencePieceModel) {
  TempDir dir;
  TokenizerOptions o;
  o.type = "SentencePieceTokenizer";
  o.model = dir.write("t.model", std::string("\x0a\x05\x0a\x03", 4));
  const auto e = error_of([&] { make_tokenizer(o); });
  EXPECT_NE(e.find("t.model: not a SentencePiece model"), std::string::npos) << e;
}

TEST(Utf8, RepairMatchesPythonReplace) {
  using dlm::data::tok::repair_utf8;
  // Expected strings are Python's bytes.decode("utf-8", "replace").
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(repair_utf8("abc\xff"), "abc" + r);
  EXPECT_EQ(repair_utf8("\xe2\x82"), r);                  // truncated sequence: one U+FFFD
  EXPECT_EQ(repair_utf8("\xe2\x28\xa1"), r + "(" + r);
  EXPECT_EQ(repair_utf8("\xed\xa0\x80"), r + r + r);      // surrogate: each byte
  EXPECT_EQ(repair_utf8("\xc0\xaf"), r + r);              // overlong
  EXPECT_EQ(repair_utf8("\xf0\x9f\x98"), r);
  EXPECT_EQ(repair_utf8("\xf4\x90\x80\x80"), r + r + r + r);
  EXPECT_TRUE(dlm::data::tok::valid_utf8("h\xc3\xa9llo \xf0\x9f\x98\x80"));
  EXPECT_FALSE(dlm::data::tok::valid_utf8("\xed\xa0\x80"));
}

TEST(Regex, WhitespaceIncludesNel) {
  using dlm::data::tok::translate_pattern;
  EXPECT_EQ(translate_pattern(R"(\s+(?!\S))"), R"([\s\x{85}]+(?![^\s\x{85}]))");
  EXPECT_EQ(translate_pattern(R"([^\s\p{L}])"), R"([^\s\x{85}\p{L}])");
  dlm::data::tok::Regex re(R"(\s+|\S+)", "test");
  std::vector<dlm::data::tok::Span> m;
  re.find_all("a\xc2\x85 b", m);  // U+0085 NEL is white space for tokenizers and tiktoken
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1].begin, 1u);
  EXPECT_EQ(m[1].end, 4u);
  EXPECT_THROW(dlm::data::tok::Regex("(", "field"), dlm::Error);
}

TEST(Bpe, CacheEqualsMergeLoopAcrossThreads) {
  using dlm::data::tok::BpeModel;
  BpeModel m;
  for (int b = 0; b < 256; ++b) {
    m.vocab.emplace(std::string(1, static_cast<char>(b)), b);
    m.byte_ids[static_cast<std::size_t>(b)] = b;
  }
  // Merges over "a".."d": every pair (x, y) -> a new id, rank by a fixed scramble.
  std::int32_t next = 256;
  for (char x = 'a'; x <= 'd'; ++x)
    for (char y = 'a'; y <= 'd'; ++y)
      m.merges.insert(x, y, {static_cast<std::uint32_t>((x * 7 + y * 13) % 17), next++});
  std::vector<std::string> words;
  std::uint64_t s = 42;
  for (int i = 0; i < 3000; ++i) {
    std::string w;
    const int len = 1 + static_cast<int>((s >> 7) % 150);
    for (int k = 0; k < len; ++k) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      w.push_back(static_cast<char>('a' + (s >> 60) % 4));
    }
    words.push_back(w);
  }
  auto run = [&](Ids& out) {
    for (int pass = 0; pass < 2; ++pass)
      for (const auto& w : words) m.encode_word(w, out);
  };
  // Second-level merges so that merged symbols merge again.
  for (std::int32_t id = 256; id < 272; ++id)
    m.merges.insert(id, 'a', {static_cast<std::uint32_t>(20 + (id * 5) % 11), next++});
  // The definition: merge the leftmost pair of lowest rank until none has a rank.
  auto naive = [&](const std::string& w, Ids& out) {
    Ids ids(w.begin(), w.end());
    while (true) {
      std::size_t best = 0;
      std::uint32_t rank = ~0u;
      for (std::size_t i = 0; i + 1 < ids.size(); ++i)
        if (const auto* mm = m.merges.find(ids[i], ids[i + 1]); mm && mm->rank < rank) rank = mm->rank, best = i;
      if (rank == ~0u) break;
      ids[best] = m.merges.find(ids[best], ids[best + 1])->id;
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    out.insert(out.end(), ids.begin(), ids.end());
  };
  Ids reference;
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& w : words) naive(w, reference);
  Ids a, b;
  std::thread t1(run, std::ref(a)), t2(run, std::ref(b));
  t1.join();
  t2.join();
  EXPECT_EQ(a, reference);
  EXPECT_EQ(b, reference);
}
