// The Python files `dlm-ckpt convert --to hf` writes beside a masked-diffusion model's weights
// (libckpt/hf_remote/, compiled in by libckpt/CMakeLists.txt): configuration_difflm.DiffLMConfig and
// modeling_difflm.DiffLM, named by config.json's auto_map.
#pragma once

#include <string_view>
#include <vector>

namespace dlm::ckpt::detail {

struct RemoteCodeFile {
  const char* name;       // file name in the export folder
  std::string_view text;  // its contents
};
const std::vector<RemoteCodeFile>& difflm_remote_code();

}  // namespace dlm::ckpt::detail
