// libFuzzer: a checkpoint's metadata.json parser on arbitrary text. Must reject with dlm::Error or accept
// a metadata whose every slice lies inside its tensor; an accepted one must survive a round trip.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "dlm/ckpt/checkpoint.h"
#include "dlm/common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto m = dlm::ckpt::metadata_from_json(text, "metadata.json");
    for (const auto& t : m.tensors)
      for (const auto& s : t.shards)
        for (const auto& p : s.pieces)
          if (p.global_start + p.length > t.shape[p.dim]) std::abort();
    const auto again = dlm::ckpt::metadata_from_json(dlm::ckpt::metadata_to_json(m), "again.json");
    if (again.tensors.size() != m.tensors.size()) std::abort();
  } catch (const dlm::Error&) {
  }
  return 0;
}
