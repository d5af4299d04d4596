// One maker per tokenizer kind; make_tokenizer() picks by --tokenizer-type.
#pragma once

#include <memory>

#include "dlm/data/tokenizer.h"

namespace dlm::data::tok {

std::unique_ptr<Tokenizer> make_null_tokenizer(const TokenizerOptions& options);
std::unique_ptr<Tokenizer> make_hf_tokenizer(const TokenizerOptions& options);
std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const TokenizerOptions& options);
std::unique_ptr<Tokenizer> make_tiktokenizer(const TokenizerOptions& options);
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerOptions& options);

}  // namespace dlm::data::tok
