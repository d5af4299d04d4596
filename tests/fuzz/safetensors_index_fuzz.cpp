// libFuzzer: model.safetensors.index.json beside two real shards (a.safetensors, b.safetensors).
// The folder must open, or refuse with dlm::Error (shard names leaving the folder included); every
// tensor of an opened folder must be readable to its last byte.
#include <cstdint>
#include <filesystem>
#include <vector>

#include "dlm/ckpt/safetensors.h"
#include "dlm/common/error.h"
#include "fuzz_util.h"

namespace {

void write_shards() {
  static const std::vector<std::uint8_t> bytes(64, 7);
  using dlm::ckpt::TensorView;
  const std::vector<TensorView> a{{"x.weight", dlm::ckpt::TensorDType::kFloat32, {2, 4}, {bytes.data(), 32}}};
  const std::vector<TensorView> b{{"y.weight", dlm::ckpt::TensorDType::kFloat32, {4}, {bytes.data(), 16}},
                                  {"z", dlm::ckpt::TensorDType::kBFloat16, {1, 2}, {bytes.data(), 4}}};
  dlm::ckpt::write_safetensors(dlm::fuzz::temp_path("st/a.safetensors"), a);
  dlm::ckpt::write_safetensors(dlm::fuzz::temp_path("st/b.safetensors"), b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool ready = [] {
    std::filesystem::create_directories(dlm::fuzz::temp_path("st"));
    write_shards();
    return true;
  }();
  (void)ready;
  dlm::fuzz::write_temp("st/model.safetensors.index.json", {reinterpret_cast<const char*>(data), size});
  try {
    const dlm::ckpt::SafetensorsFolder folder(dlm::fuzz::temp_path("st"));
    volatile std::uint8_t sink = 0;
    for (const auto* v : folder.tensors())
      if (!v->bytes.empty()) sink = sink ^ v->bytes.back();
  } catch (const dlm::Error&) {
  }
  return 0;
}
