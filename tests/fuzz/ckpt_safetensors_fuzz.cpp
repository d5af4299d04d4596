// libFuzzer: the safetensors header parser on arbitrary bytes. Must reject with dlm::Error or accept
// with every view inside the input.
#include <cstdint>
#include <cstdlib>

#include "dlm/ckpt/safetensors.h"
#include "dlm/common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto h = dlm::ckpt::parse_safetensors({data, size}, "fuzz.safetensors");
    for (const auto& v : h.tensors) {
      if (v.bytes.size() && (v.bytes.data() < data || v.bytes.data() + v.bytes.size() > data + size)) std::abort();
      volatile std::uint8_t sink = v.bytes.empty() ? 0 : v.bytes.back();
      (void)sink;
    }
  } catch (const dlm::Error&) {
  }
  return 0;
}
