// libFuzzer: tokenizer.json loading, then encode and decode of text taken from the same input.
// The input is "<json>\0<text>": any file the loader accepts must encode any text without a crash,
// and everything it refuses must be refused with dlm::Error.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "dlm/common/error.h"
#include "dlm/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const auto cut = input.find('\0');
  const std::string json = input.substr(0, cut);
  const std::string text = cut == std::string::npos ? "Hello world 123 \xc3\xa9\xff  x" : input.substr(cut + 1);
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("dlm_tok_fuzz_" + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << json;
  dlm::data::TokenizerOptions o;
  o.type = "HuggingFaceTokenizer";
  o.model = path;
  o.hf_include_special_tokens = size % 2 == 0;
  try {
    const auto t = dlm::data::make_tokenizer(o);
    const auto ids = t->encode(text);
    (void)t->decode(ids);
  } catch (const dlm::Error&) {
  }
  return 0;
}
