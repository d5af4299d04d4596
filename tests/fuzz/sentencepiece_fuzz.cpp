// libFuzzer: a SentencePiece .model (a protobuf) through dlm's loader, then encode/decode.
// Input: "<model bytes>" with the text fixed (the model is binary and may hold NULs).
#include <cstdint>

#include "dlm/common/error.h"
#include "dlm/data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dlm::data::TokenizerOptions o;
  o.type = size % 2 ? "SentencePieceTokenizer" : "Llama2Tokenizer";
  o.model = dlm::fuzz::write_temp("sp.model", {reinterpret_cast<const char*>(data), size});
  try {
    const auto t = dlm::data::make_tokenizer(o);
    (void)t->decode(t->encode("Hello world, it's 2026 \xc3\xa9\xff  x <unk> </s>"));
  } catch (const dlm::Error&) {
  }
  return 0;
}
