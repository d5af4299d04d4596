// libFuzzer: a .jsonl.zst file (arbitrary bytes: corrupt frames, truncated frames, several frames)
// through ByteSource + LineBlockReader, every line then through JsonFieldReader. Bad input must end
// in dlm::Error naming the file; lines must come out whole.
#include <cstdint>
#include <cstdlib>

#include "dlm/common/error.h"
#include "dlm/data/jsonl.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = dlm::fuzz::write_temp("in.jsonl.zst", {reinterpret_cast<const char*>(data), size});
  static dlm::data::JsonFieldReader fields({"text"});
  try {
    dlm::data::LineBlockReader reader({path}, 4096);
    dlm::data::LineBlock block;
    while (reader.next(block)) {
      if (block.bytes.size() < block.used + dlm::data::json_padding()) std::abort();  // simdjson reads past
      std::size_t start = 0;
      for (std::size_t i = 0; i < block.used; ++i) {
        if (block.bytes[i] != '\n' && i + 1 != block.used) continue;
        const std::size_t end = block.bytes[i] == '\n' ? i : i + 1;
        (void)fields.read(block.bytes.data() + start, end - start);
        start = i + 1;
      }
    }
  } catch (const dlm::Error&) {
  }
  return 0;
}
