// libFuzzer: a SentencePiece .model (a protobuf) through dlm's loader, then encode/decode of a text
// (the native BPE or unigram encoder where the model takes one, libsentencepiece otherwise).
// Input: "<text>\0<model bytes>" (the model may hold NULs; the text is repaired if not UTF-8), or
// "<model bytes>" alone with a fixed text.
#include <cstdint>

#include "dlm/common/error.h"
#include "dlm/data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = dlm::fuzz::split_parts(data, size, 2);
  const std::string text = parts.size() == 2 ? parts[0] : "Hello world, it's 2026 \xc3\xa9\xff  x <unk> </s>";
  dlm::data::TokenizerOptions o;
  o.type = size % 2 ? "SentencePieceTokenizer" : "Llama2Tokenizer";
  o.model = dlm::fuzz::write_temp("sp.model", parts.back());
  try {
    const auto t = dlm::data::make_tokenizer(o);
    (void)t->decode(t->encode(text));
  } catch (const dlm::Error&) {
  }
  return 0;
}
