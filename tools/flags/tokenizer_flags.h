// Megatron's --tokenizer-* flags (and --vocab-size, --vocab-file, --merge-file, --tiktoken-*), declared once for
// every tool that opens a tokenizer: dlm-preprocess (and its inspect), dlm-blend, dlm-train, dlm-generate.
#pragma once

#include <string>

#include <boost/program_options.hpp>

#include "dlm/data/tokenizer.h"

namespace dlm::tools {

struct TokenizerFlagDefaults {
  std::string type;             // --tokenizer-type's default ("": none, no tokenizer unless given)
  bool model_required = false;  // --tokenizer-model must be given (a usage error otherwise)
};

// Adds the flags to `opts`; parsing them fills `tokenizer` (--vocab-size sets tokenizer.vocab_size: NullTokenizer's
// and TikTokenizer's vocabulary, and dlm-train's model vocabulary).
void add_tokenizer_flags(boost::program_options::options_description& opts, data::TokenizerOptions& tokenizer,
                         const TokenizerFlagDefaults& defaults = {});

}  // namespace dlm::tools
