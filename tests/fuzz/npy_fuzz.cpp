// libFuzzer: a .npy file (Megatron's cached document/sample/shuffle indices) through NpyArray::load.
// An accepted array must hold exactly size() elements in the mapped file: all are read.
#include <cstdint>
#include <cstdlib>

#include "dlm/common/error.h"
#include "dlm/data/npy.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = dlm::fuzz::write_temp("a.npy", {reinterpret_cast<const char*>(data), size});
  try {
    const auto a = dlm::data::NpyArray::load(path);
    if (a.size_bytes() > size) std::abort();
    std::int64_t sum = 0;
    for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] & 1;
    volatile std::int64_t sink = sum;
    (void)sink;
  } catch (const dlm::Error&) {
  }
  return 0;
}
