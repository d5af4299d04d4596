// Tokenizer: text <-> token ids, the interface every tokenizer kind in libdata implements.
//
// Kinds are named as Megatron names them (--tokenizer-type): HuggingFaceTokenizer, GPT2BPETokenizer,
// TikTokenizer, SentencePieceTokenizer, Llama2Tokenizer, NullTokenizer. Every kind gives exactly the ids
// of its reference library (tokenizers, tiktoken, sentencepiece) and is safe to call from many threads
// at once (encode/decode are const and share no mutable state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dlm::data {

// Ids with a role; absent when the tokenizer has none.
struct SpecialIds {
  std::optional<std::int32_t> eod;   // appended by --append-eod (Megatron's tokenizer.eod)
  std::optional<std::int32_t> bos;
  std::optional<std::int32_t> eos;
  std::optional<std::int32_t> pad;
  std::optional<std::int32_t> mask;  // the diffusion mask token (MegaDLMs' <|mask_token|>)
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` to `out`, exactly as Megatron's tokenizer of this kind tokenizes a
  // document in tools/preprocess_data.py (post-processor bos/eos included where Megatron's has them).
  virtual void encode(std::string_view text, std::vector<std::int32_t>& out) const = 0;
  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> out;
    encode(text, out);
    return out;
  }
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;

  // Number of ids (Megatron's tokenizer.vocab_size, before padding for the model).
  virtual std::size_t vocab_size() const = 0;
  virtual const SpecialIds& special_ids() const = 0;
  // The --tokenizer-type name.
  virtual std::string_view kind() const = 0;

  // The eod id, or a dlm::Error when this tokenizer has none.
  std::int32_t eod() const;
};

// What --tokenizer-* flags say, as Megatron's arguments.
struct TokenizerOptions {
  std::string type;                 // --tokenizer-type
  std::string model;                // --tokenizer-model: tokenizer.json, its folder, .model, tiktoken file
  std::string vocab_file;           // --vocab-file (GPT2BPETokenizer)
  std::string merge_file;           // --merge-file (GPT2BPETokenizer)
  std::string tiktoken_pattern;     // --tiktoken-pattern: v1 | v2
  std::size_t tiktoken_num_special_tokens = 1000;       // --tiktoken-num-special-tokens
  std::vector<std::string> tiktoken_special_tokens;     // --tiktoken-special-tokens
  std::optional<std::size_t> vocab_size;                // --vocab-size (NullTokenizer)
  std::optional<std::int32_t> mask_token;               // --mask-token overrides the mask id
  bool hf_include_special_tokens = false;  // --tokenizer-hf-include-special-tokens: add the
                                           // post-processor's bos/eos (Megatron's default: no)
};

// Builds the tokenizer the options name; throws dlm::Error naming the file and field that is wrong,
// or "unsupported: <json path>" for a tokenizer.json feature dlm does not implement.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options);

}  // namespace dlm::data
