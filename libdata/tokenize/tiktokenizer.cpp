// TikTokenizer: Megatron's tiktoken kind. The rank file is a JSON list of {rank, token_bytes
// (base64), token_str} (or a tekken file holding that list under "vocab"); ids are ranks shifted
// up by --tiktoken-num-special-tokens, whose first ids are <unk> <s> </s> <mask> <pad> <cls> <sep>
// and fillers <SPECIAL_i>. The pattern is Megatron's v1 or v2 (not the file's); special tokens
// written in the text are matched (encode(text, allowed_special="all")).
//
// tiktoken merges by the rank of the merged bytes and takes a piece that is itself a token as is:
// here that is a BPE pair table holding every split of every token into two tokens, with
// ignore_merges on.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "dlm/common/error.h"
#include "hf_tokenizer.h"
#include "kinds.h"
#include "text.h"

namespace dlm::data::tok {
namespace {

const char* const kPatternV1 =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
const char* const kPatternV2 =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool base64_decode(const std::string& in, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out.clear();
  std::uint32_t acc = 0;
  int bits = 0;
  std::size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    const int v = value(in[i]);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  for (; i < in.size(); ++i)
    if (in[i] != '=') return false;
  return in.size() % 4 == 0;
}

class TikTokenizer final : public Tokenizer {
 public:
  TikTokenizer(BpeModel model, std::vector<std::string> pieces, std::vector<std::string> specials,
               const std::string& pattern, std::size_t vocab)
      : model_(std::move(model)), pieces_(std::move(pieces)), specials_(std::move(specials)),
        regex_(pattern, "--tiktoken-pattern"), vocab_(vocab) {
    std::vector<AddedToken> added;
    for (std::size_t i = 0; i < specials_.size(); ++i) added.push_back({specials_[i], static_cast<std::int32_t>(i)});
    matcher_ = AddedTokenMatcher(std::move(added));
    ids_.bos = 1;
    ids_.eos = ids_.eod = 2;
    ids_.mask = 3;
    ids_.pad = 4;
  }

  void encode(std::string_view text, std::vector<std::int32_t>& out) const override {
    std::string repaired;
    if (!valid_utf8(text)) text = repaired = repair_utf8(text);
    std::vector<AddedTokenMatcher::Piece> pieces;
    std::vector<Span> words;
    matcher_.split(text, pieces);
    for (const auto& p : pieces) {
      if (p.id >= 0) {
        out.push_back(p.id);
        continue;
      }
      // A chunk of words at a time: a 1 GB document holds ~250M of them.
      for (std::size_t at = 0; at < p.text.size();) {
        words.clear();
        at = regex_.find_some(p.text, at, words, 4096);
        for (const auto& w : words) model_.encode_word(p.text.substr(w.begin, w.end - w.begin), out);
      }
    }
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string out;
    for (auto id : ids) {
      if (id < 0 || static_cast<std::size_t>(id) >= vocab_)
        fail("TikTokenizer: cannot decode id " + std::to_string(id));
      const auto i = static_cast<std::size_t>(id);
      out += i < specials_.size() ? specials_[i] : pieces_[i - specials_.size()];
    }
    return out;
  }
  std::size_t vocab_size() const override { return vocab_; }
  const SpecialIds& special_ids() const override { return ids_; }
  std::string_view kind() const override { return "TikTokenizer"; }

 private:
  BpeModel model_;
  std::vector<std::string> pieces_;  // bytes of rank r at r
  std::vector<std::string> specials_;
  Regex regex_;
  AddedTokenMatcher matcher_;
  std::size_t vocab_;
  SpecialIds ids_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_tiktokenizer(const TokenizerOptions& o) {
  if (o.model.empty()) fail("TikTokenizer needs --tokenizer-model (a tiktoken JSON rank file)");
  const std::string& file = o.model;
  const std::string which = o.tiktoken_pattern.empty() ? "v2" : o.tiktoken_pattern;
  if (which != "v1" && which != "v2") fail("--tiktoken-pattern: expected v1 or v2, got \"" + which + "\"");
  const std::size_t vocab = o.vocab_size.value_or(131072);
  const std::size_t nspecial = o.tiktoken_num_special_tokens;

  std::vector<std::string> specials = o.tiktoken_special_tokens;
  if (specials.empty()) specials = {"<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"};
  for (const char* required : {"<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"})
    if (std::find(specials.begin(), specials.end(), required) == specials.end())
      fail(std::string("--tokenizer-special-tokens must include ") + required);
  if (specials.size() > nspecial || nspecial >= vocab)
    fail("TikTokenizer: need special tokens <= --tiktoken-num-special-tokens < --vocab-size");
  for (std::size_t i = specials.size(); i < nspecial; ++i) specials.push_back("<SPECIAL_" + std::to_string(i) + ">");
  // Megatron's fixed roles are positions in the list; the maker below assumes the default order.
  if (specials[1] != "<s>" || specials[2] != "</s>" || specials[3] != "<mask>" || specials[4] != "<pad>")
    fail("--tokenizer-special-tokens: dlm expects <unk> <s> </s> <mask> <pad> first, in that order");

  const nlohmann::json j = read_json(file);
  const nlohmann::json* list = &j;
  if (j.is_object() && j.contains("vocab")) list = &j["vocab"];
  if (!list->is_array()) fail_at(file, "expected a JSON list of {rank, token_bytes, token_str} (or a tekken file)");
  const std::size_t inner = vocab - nspecial;
  if (list->size() < inner)
    fail_at(file, "has " + std::to_string(list->size()) + " ranks, fewer than --vocab-size minus special tokens (" +
                      std::to_string(inner) + ")");

  BpeModel m;
  m.symbols = BpeModel::Symbols::kBytes;
  m.ignore_merges = true;
  std::vector<std::string> pieces(inner);
  for (std::size_t r = 0; r < inner; ++r) {
    const std::string where = "vocab[" + std::to_string(r) + "]";
    const auto& e = (*list)[r];
    if (!e.is_object() || !e.contains("rank") || !e.contains("token_bytes") || !e["token_bytes"].is_string())
      fail_at(file, where + ": expected {rank, token_bytes, token_str}");
    if (!e["rank"].is_number_integer() || e["rank"].get<std::int64_t>() != static_cast<std::int64_t>(r))
      fail_at(file, where + ".rank: expected " + std::to_string(r));
    if (!base64_decode(e["token_bytes"].get<std::string>(), pieces[r]) || pieces[r].empty())
      fail_at(file, where + ".token_bytes: not base64");
    if (r < 256 && pieces[r] != std::string(1, static_cast<char>(r)))
      fail_at(file, where + ": the first 256 ranks must be the single bytes in order");
    const auto id = static_cast<std::int32_t>(r + nspecial);
    if (!m.vocab.emplace(pieces[r], id).second) fail_at(file, where + ".token_bytes: duplicate token");
    if (r < 256) m.byte_ids[r] = id;
  }
  m.merges.reserve(inner * 4);
  for (std::size_t r = 256; r < inner; ++r) {
    const std::string& t = pieces[r];
    for (std::size_t k = 1; k < t.size(); ++k) {
      auto a = m.vocab.find(std::string_view(t).substr(0, k));
      auto b = m.vocab.find(std::string_view(t).substr(k));
      if (a != m.vocab.end() && b != m.vocab.end())
        m.merges.insert(a->second, b->second, {static_cast<std::uint32_t>(r), static_cast<std::int32_t>(r + nspecial)});
    }
  }
  return std::make_unique<TikTokenizer>(std::move(m), std::move(pieces), std::move(specials),
                                        which == "v1" ? kPatternV1 : kPatternV2, vocab);
}

}  // namespace dlm::data::tok
