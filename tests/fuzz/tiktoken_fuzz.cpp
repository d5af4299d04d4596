// libFuzzer: a tiktoken rank file (Megatron's JSON list of {rank, token_bytes, token_str}), then
// encode/decode. Input: "<rank file>\0<text>"; the pattern and special-token count come from the size.
#include <cstdint>

#include "dlm/common/error.h"
#include "dlm/data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = dlm::fuzz::split_parts(data, size, 2);
  dlm::data::TokenizerOptions o;
  o.type = "TikTokenizer";
  o.model = dlm::fuzz::write_temp("ranks.json", parts[0]);
  o.tiktoken_pattern = size % 2 ? "v1" : "v2";
  o.tiktoken_num_special_tokens = size % 3 == 0 ? 1000 : 4;
  const std::string text = parts.size() > 1 ? parts[1] : "Hello world, it's 2026 \xc3\xa9\xff  x";
  try {
    const auto t = dlm::data::make_tokenizer(o);
    (void)t->decode(t->encode(text));
  } catch (const dlm::Error&) {
  }
  return 0;
}
