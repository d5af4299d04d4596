// HuggingFaceTokenizer: a `tokenizers` tokenizer.json with a BPE model, run through the same stages
// in the same order as `tokenizers`: added tokens that are not normalized are found in the raw text,
// the rest is normalized, normalized added tokens are found, pre-tokenizers split what is left
// into words, the BPE model encodes each word, and (when asked) the post-processor's template
// adds its special tokens.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "added_tokens.h"
#include "bpe.h"
#include "dlm/data/tokenizer.h"
#include "regex.h"

namespace dlm::data::tok {

struct Normalizer {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kPrepend, kReplace };
  Kind kind;
  std::string text;     // kPrepend: the prefix; kReplace: the literal pattern
  std::string content;  // kReplace: the replacement
  std::shared_ptr<Regex> regex;  // kReplace with a Regex pattern
};

struct PreTokenizer {
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext };
  enum class Prepend { kAlways, kFirst, kNever };
  Kind kind = Kind::kSplit;
  std::shared_ptr<Regex> regex;  // kSplit with a Regex pattern; kByteLevel with use_regex
  std::string literal;           // kSplit with a String pattern
  Behavior behavior = Behavior::kIsolated;
  bool add_prefix_space = false;  // kByteLevel
  std::string replacement;        // kMetaspace
  Prepend prepend = Prepend::kAlways;
  bool split = true;              // kMetaspace
};

struct Decoder {
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
  Kind kind = Kind::kFuse;
  std::string pattern, content;  // kReplace; kMetaspace (replacement in pattern); kStrip (content)
  bool prepend = true;           // kMetaspace: prepend_scheme is not "never"
  std::size_t start = 0, stop = 0;  // kStrip
};

struct HfConfig {
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  BpeModel model;
  std::vector<AddedToken> raw_added, normalized_added;
  std::vector<std::int32_t> template_single;  // -1 stands for the text; empty: no post-processor ids
  std::vector<Decoder> decoders;
  bool has_decoder = false;
  std::vector<std::string> id_to_token;  // tokens as written in the file, for decoding
  std::size_t vocab_size = 0;
  SpecialIds special;
};

// The GPT-2 pre-tokenizer pattern (ByteLevel's use_regex).
extern const char* const kGpt2Pattern;

// Reads `path` (a tokenizer.json, or a folder holding one and maybe tokenizer_config.json).
HfConfig load_hf_config(const std::string& path);
// The same from parsed JSON; errors name `file`.
HfConfig hf_config_from_json(const nlohmann::json& j, const std::string& file);
// Parses a JSON file; a syntax error names the file and byte offset.
nlohmann::json read_json(const std::string& path);

class HuggingFaceTokenizer final : public Tokenizer {
 public:
  // `kind` is the --tokenizer-type this configuration came from (GPT2BPETokenizer builds one too).
  HuggingFaceTokenizer(HfConfig config, bool include_special_tokens, std::string kind = "HuggingFaceTokenizer");
  void encode(std::string_view text, std::vector<std::int32_t>& out) const override;
  std::string decode(std::span<const std::int32_t> ids) const override;
  std::size_t vocab_size() const override { return c_.vocab_size; }
  const SpecialIds& special_ids() const override { return c_.special; }
  std::string_view kind() const override { return kind_; }

 private:
  void encode_valid(std::string_view text, std::vector<std::int32_t>& out) const;
  HfConfig c_;
  AddedTokenMatcher raw_, normalized_;
  bool include_special_tokens_;
  std::string kind_;
};

}  // namespace dlm::data::tok
