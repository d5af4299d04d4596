// libFuzzer: GPT-2 vocab.json + merges.txt, then encode/decode. Input: "<vocab>\0<merges>\0<text>".
#include <cstdint>

#include "dlm/common/error.h"
#include "dlm/data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = dlm::fuzz::split_parts(data, size, 3);
  dlm::data::TokenizerOptions o;
  o.type = "GPT2BPETokenizer";
  o.vocab_file = dlm::fuzz::write_temp("vocab.json", parts[0]);
  o.merge_file = dlm::fuzz::write_temp("merges.txt", parts.size() > 1 ? parts[1] : "");
  const std::string text = parts.size() > 2 ? parts[2] : "Hello world, it's 2026 \xc3\xa9\xff  x";
  try {
    const auto t = dlm::data::make_tokenizer(o);
    (void)t->decode(t->encode(text));
  } catch (const dlm::Error&) {
  }
  return 0;
}
