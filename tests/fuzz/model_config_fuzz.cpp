// libFuzzer: a model configuration, as a Hugging Face config.json (odd sizes) or dlm's own JSON
// (even sizes). Accepted configs must survive a write/read round trip unchanged in their shape.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "dlm/ckpt/hf.h"
#include "dlm/ckpt/model_config.h"
#include "dlm/common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    if (size % 2) {
      const auto c = dlm::ckpt::model_config_from_hf_json(text, "config.json");
      const auto again = dlm::ckpt::model_config_from_hf_json(
          dlm::ckpt::model_config_to_hf_json(c, dlm::ckpt::TensorDType::kBFloat16), "again.json");
      if (again.num_layers != c.num_layers || again.hidden_size != c.hidden_size) std::abort();
    } else {
      (void)dlm::ckpt::model_config_from_json(text, "model.json");
    }
  } catch (const dlm::Error&) {
  }
  return 0;
}
