// One maker per tokenizer kind; make_tokenizer() picks by --tokenizer-type.
#pragma once

#include <memory>
#include <string>

#include "dlm/data/tokenizer.h"

namespace dlm::data::tok {

std::unique_ptr<Tokenizer> make_null_tokenizer(const TokenizerOptions& options);
std::unique_ptr<Tokenizer> make_hf_tokenizer(const TokenizerOptions& options);
std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const TokenizerOptions& options);
std::unique_ptr<Tokenizer> make_tiktokenizer(const TokenizerOptions& options);
// `native` false keeps every encode and decode in libsentencepiece (tests compare the two).
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerOptions& options, bool native = true);

// How a SentencePiece tokenizer encodes: "native BPE", or "libsentencepiece: <why not native>";
// empty for the other kinds.
std::string sentencepiece_encoder(const Tokenizer& t);
// How it decodes: "native", or "libsentencepiece: <why not native>"; empty for the other kinds.
std::string sentencepiece_decoder(const Tokenizer& t);

}  // namespace dlm::data::tok
