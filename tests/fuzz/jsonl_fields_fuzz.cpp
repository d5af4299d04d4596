// libFuzzer: one JSONL line through JsonFieldReader (simdjson on-demand) with the keys "text" and
// "title". It must return a message or fields whose string views lie inside the reader's own storage
// and hold valid data (read to the last byte), never crash.
#include <cstdint>
#include <cstring>
#include <vector>

#include "dlm/data/jsonl.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static dlm::data::JsonFieldReader reader({"text", "title"});
  std::vector<char> line(size + dlm::data::json_padding(), '\0');
  if (size) std::memcpy(line.data(), data, size);
  const auto message = reader.read(line.data(), size);
  if (message.empty()) {
    volatile char sink = 0;
    for (const auto& f : reader.fields())
      for (const auto part : f.parts)
        for (const char c : part) sink = sink ^ c;
  }
  return 0;
}
