#include "dlm/data/tokenizer.h"

#include "dlm/common/error.h"
#include "hf_tokenizer.h"
#include "kinds.h"

namespace dlm::data {

std::int32_t Tokenizer::eod() const {
  const auto& id = special_ids().eod;
  if (!id) fail("the " + std::string(kind()) + " tokenizer has no eod token");
  return *id;
}

namespace tok {

std::unique_ptr<Tokenizer> make_hf_tokenizer(const TokenizerOptions& o) {
  if (o.model.empty()) fail("HuggingFaceTokenizer needs --tokenizer-model (a tokenizer.json or its folder)");
  return std::make_unique<HuggingFaceTokenizer>(load_hf_config(o.model), o.hf_include_special_tokens);
}

}  // namespace tok

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& o) {
  std::unique_ptr<Tokenizer> t;
  if (o.type == "HuggingFaceTokenizer") {
    t = tok::make_hf_tokenizer(o);
  } else if (o.type == "GPT2BPETokenizer") {
    t = tok::make_gpt2_tokenizer(o);
  } else if (o.type == "TikTokenizer") {
    t = tok::make_tiktokenizer(o);
  } else if (o.type == "SentencePieceTokenizer" || o.type == "GPTSentencePieceTokenizer" ||
             o.type == "Llama2Tokenizer") {
    t = tok::make_sentencepiece_tokenizer(o);
  } else if (o.type == "NullTokenizer") {
    t = tok::make_null_tokenizer(o);
  } else {
    fail("--tokenizer-type: unknown tokenizer type \"" + o.type +
         "\" (expected HuggingFaceTokenizer, GPT2BPETokenizer, TikTokenizer, SentencePieceTokenizer, "
         "Llama2Tokenizer or NullTokenizer)");
  }
  if (o.mask_token) {
    if (*o.mask_token < 0 || static_cast<std::size_t>(*o.mask_token) >= t->vocab_size())
      fail("--mask-token " + std::to_string(*o.mask_token) + " is outside the vocabulary (" +
           std::to_string(t->vocab_size()) + " ids)");
    const_cast<SpecialIds&>(t->special_ids()).mask = *o.mask_token;
  }
  return t;
}

}  // namespace dlm::data
