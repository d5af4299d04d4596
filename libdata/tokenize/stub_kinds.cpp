// Placeholder makers for the kinds still being written (removed as each lands).
#include "dlm/common/error.h"
#include "kinds.h"

namespace dlm::data::tok {

std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const TokenizerOptions&) { fail("GPT2BPETokenizer: not yet built"); }
std::unique_ptr<Tokenizer> make_tiktokenizer(const TokenizerOptions&) { fail("TikTokenizer: not yet built"); }
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerOptions&) {
  fail("SentencePieceTokenizer: not yet built");
}

}  // namespace dlm::data::tok
