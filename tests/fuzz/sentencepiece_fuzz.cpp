// libFuzzer: a SentencePiece .model (a protobuf) through dlm's loader, then encode/decode of a text
// (the native BPE or unigram encoder where the model takes one, libsentencepiece otherwise), and the
// decode of ids read from the text's bytes (two bytes an id, modulo the vocabulary: runs of byte
// pieces, control and unknown pieces in any order).
// Input: "<text>\0<model bytes>" (the model may hold NULs; the text is repaired if not UTF-8), or
// "<model bytes>" alone with a fixed text.
#include <cstdint>
#include <vector>

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
    std::vector<std::int32_t> ids;
    for (std::size_t i = 0; i + 1 < text.size(); i += 2)
      ids.push_back(static_cast<std::int32_t>((static_cast<unsigned char>(text[i]) | static_cast<unsigned char>(text[i + 1]) << 8) %
                                              t->vocab_size()));
    (void)t->decode(ids);
  } catch (const dlm::Error&) {
  }
  return 0;
}
